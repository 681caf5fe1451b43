//! Extended attributes: GETXATTR as the rings answer it themselves (the
//! `security.capability` every write asks), and fuser's session through
//! the same code.

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
}
