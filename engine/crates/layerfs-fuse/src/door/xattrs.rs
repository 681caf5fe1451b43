//! Extended attributes, as overlayfs keeps them (the stack copies a file
//! up to change them): GETXATTR (the `security.capability` every write
//! asks); LISTXATTR, SETXATTR and REMOVEXATTR. The kernel has
//! checked the caller's right to the name's namespace
//! (`default_permissions`, CAP_SYS_ADMIN for `trusted.`).

use super::*;

impl Door {
    pub(crate) fn getxattr_as(
        &self,
        ino: INodeNo,
        name: &[u8],
        size: u32,
        reply: impl XattrAnswer,
    ) {
        if !self.xattrs {
            return reply.error(Errno::ENOSYS);
        }
        let capability = name == CAPABILITY;
        if capability && self.no_caps.has_none(ino) {
            return reply.error(Errno::ENODATA);
        }
        match self.fs.getxattr(self.id(ino), name) {
            Ok(value) => xattr_reply(reply, &value, size),
            Err(Error::NoData) if capability => {
                self.no_caps.found_none(ino);
                reply.error(Errno::ENODATA)
            }
            Err(e) => reply.error(errno(e)),
        }
    }

    pub(crate) fn listxattr_as(&self, ino: INodeNo, size: u32, reply: impl XattrAnswer) {
        if !self.xattrs {
            return reply.error(Errno::ENOSYS);
        }
        match self.fs.listxattr(self.id(ino)) {
            Ok(names) => xattr_reply(reply, &names, size),
            Err(e) => reply.error(errno(e)),
        }
    }

    pub(crate) fn setxattr_as(
        &self,
        ino: INodeNo,
        (name, value): (&[u8], &[u8]),
        flags: i32,
        reply: impl EmptyAnswer,
    ) {
        if !self.xattrs {
            return reply.error(Errno::ENOSYS);
        }
        let flags = match flags {
            0 => XattrFlags::Either,
            libc::XATTR_CREATE => XattrFlags::Create,
            libc::XATTR_REPLACE => XattrFlags::Replace,
            _ => return reply.error(Errno::EINVAL),
        };
        let set = self.fs.setxattr(self.id(ino), name, value, flags);
        // After the change: a "none" found while it ran is forgotten too.
        self.no_caps.forget();
        done(reply, set)
    }

    pub(crate) fn removexattr_as(&self, ino: INodeNo, name: &[u8], reply: impl EmptyAnswer) {
        if !self.xattrs {
            return reply.error(Errno::ENOSYS);
        }
        let removed = self.fs.removexattr(self.id(ino), name);
        self.no_caps.forget();
        done(reply, removed)
    }
}

#[cfg(test)]
mod tests {
    use super::super::testing::{ask, entry, me, Got, ROOT};
    use super::*;

    #[test]
    fn an_attribute_is_set_read_listed_and_removed_as_its_flags_say() {
        // A directory served as it is keeps no extended attributes; a stack
        // does, as overlayfs does (the file is copied up to change them).
        let (lower, upper) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        std::fs::write(lower.path().join("f"), b"x").unwrap();
        let stack =
            layerfs_layers::StackFs::open_in_upper(&[lower.path().to_owned()], upper.path());
        let d = Door::new(Arc::new(stack.unwrap()), Caching::Exclusive);
        assert!(d.xattrs, "a stack keeps extended attributes");
        let f = entry(ask(|r| d.lookup_as(me(), ROOT, b"f", r))).ino;
        let set =
            |flags: i32, value: &[u8]| ask(|r| d.setxattr_as(f, (b"user.k", value), flags, r));
        let replace = set(libc::XATTR_REPLACE, b"v");
        assert_eq!(replace, Got::Error(Errno::ENODATA), "nothing to replace");
        assert_eq!(set(libc::XATTR_CREATE, b"v1"), Got::Ok);
        assert_eq!(
            set(libc::XATTR_CREATE, b"v2"),
            Got::Error(Errno::from_i32(libc::EEXIST))
        );
        assert_eq!(set(libc::XATTR_REPLACE, b"value"), Got::Ok);
        assert_eq!(
            set(0x40, b"v"),
            Got::Error(Errno::EINVAL),
            "an unknown flag"
        );

        assert_eq!(ask(|r| d.getxattr_as(f, b"user.k", 0, r)), Got::Size(5));
        assert_eq!(
            ask(|r| d.getxattr_as(f, b"user.k", 64, r)),
            Got::Data(b"value".to_vec())
        );
        assert_eq!(
            ask(|r| d.getxattr_as(f, b"user.k", 2, r)),
            Got::Error(Errno::ERANGE)
        );
        let Got::Data(names) = ask(|r| d.listxattr_as(f, 4096, r)) else {
            panic!("no list")
        };
        assert!(
            names.split(|&b| b == 0).any(|n| n == b"user.k"),
            "{names:?}"
        );

        assert_eq!(ask(|r| d.removexattr_as(f, b"user.k", r)), Got::Ok);
        let gone = ask(|r| d.getxattr_as(f, b"user.k", 64, r));
        assert_eq!(gone, Got::Error(Errno::ENODATA));
        let again = ask(|r| d.removexattr_as(f, b"user.k", r));
        assert_eq!(again, Got::Error(Errno::ENODATA));
    }
}
