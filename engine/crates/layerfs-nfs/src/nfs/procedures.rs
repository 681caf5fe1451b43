//! The NFSv3 procedures (RFC 1813 §3.3): number, name, and how the server
//! treats each, in one table.

/// Declares [`Proc`] from the table: one row per procedure.
macro_rules! procedures {
    ($($proc:ident = $number:literal, $name:literal, changes: $changes:literal, runs: $runs:ident, copies_up: $copies_up:literal, fail: $fail:literal;)*) => {
        /// An NFSv3 procedure.
        #[derive(Clone, Copy, Debug, PartialEq, Eq)]
        pub enum Proc {
            $($proc = $number,)*
        }

        impl Proc {
            pub fn from_number(number: u32) -> Option<Proc> {
                match number {
                    $($number => Some(Proc::$proc),)*
                    _ => None,
                }
            }

            pub fn name(self) -> &'static str {
                match self {
                    $(Proc::$proc => $name,)*
                }
            }

            /// Changes the filesystem: a retransmission gets the first
            /// reply from the reply cache, not a second run.
            pub fn changes(self) -> bool {
                match self {
                    $(Proc::$proc => $changes,)*
                }
            }

            /// Which thread runs the call when the filesystem knows its
            /// files without a walk and copies nothing up: metadata reads
            /// the host answers from its caches on the connection's reader,
            /// single-entry changes there too when the connection is idle.
            pub fn runs(self) -> layerfs_rpc::Placement {
                match self {
                    $(Proc::$proc => layerfs_rpc::Placement::$runs,)*
                }
            }

            /// May change a lower file of a layered filesystem, which then
            /// copies it up first, in time that grows with its size.
            pub fn copies_up(self) -> bool {
                match self {
                    $(Proc::$proc => $copies_up,)*
                }
            }

            /// The optional attributes (`post_op_attr`, and two per
            /// `wcc_data`) in the procedure's failure reply.
            pub fn optional_attributes_on_failure(self) -> usize {
                match self {
                    $(Proc::$proc => $fail,)*
                }
            }
        }
    };
}

procedures! {
    Null = 0, "NULL", changes: false, runs: Reader, copies_up: false, fail: 0;
    Getattr = 1, "GETATTR", changes: false, runs: Reader, copies_up: false, fail: 0;
    Setattr = 2, "SETATTR", changes: true, runs: Reader, copies_up: true, fail: 2;
    Lookup = 3, "LOOKUP", changes: false, runs: Reader, copies_up: false, fail: 1;
    Access = 4, "ACCESS", changes: false, runs: Reader, copies_up: false, fail: 1;
    Readlink = 5, "READLINK", changes: false, runs: Reader, copies_up: false, fail: 1;
    Read = 6, "READ", changes: false, runs: Worker, copies_up: false, fail: 1;
    Write = 7, "WRITE", changes: true, runs: ReaderWhenIdle, copies_up: true, fail: 2;
    Create = 8, "CREATE", changes: true, runs: Reader, copies_up: false, fail: 2;
    Mkdir = 9, "MKDIR", changes: true, runs: Reader, copies_up: false, fail: 2;
    Symlink = 10, "SYMLINK", changes: true, runs: Reader, copies_up: false, fail: 2;
    Mknod = 11, "MKNOD", changes: true, runs: Reader, copies_up: false, fail: 2;
    Remove = 12, "REMOVE", changes: true, runs: Reader, copies_up: true, fail: 2;
    Rmdir = 13, "RMDIR", changes: true, runs: Reader, copies_up: false, fail: 2;
    Rename = 14, "RENAME", changes: true, runs: Reader, copies_up: true, fail: 4;
    Link = 15, "LINK", changes: true, runs: Reader, copies_up: true, fail: 3;
    Readdir = 16, "READDIR", changes: false, runs: ReaderWhenIdle, copies_up: false, fail: 1;
    Readdirplus = 17, "READDIRPLUS", changes: false, runs: ReaderWhenIdle, copies_up: false, fail: 1;
    Fsstat = 18, "FSSTAT", changes: false, runs: Worker, copies_up: false, fail: 1;
    Fsinfo = 19, "FSINFO", changes: false, runs: Reader, copies_up: false, fail: 1;
    Pathconf = 20, "PATHCONF", changes: false, runs: Reader, copies_up: false, fail: 1;
    Commit = 21, "COMMIT", changes: false, runs: Worker, copies_up: false, fail: 2;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_round_trip_and_stop_at_commit() {
        for n in 0..22 {
            assert_eq!(Proc::from_number(n).unwrap() as u32, n);
        }
        assert_eq!(Proc::from_number(22), None);
        assert_eq!(Proc::Readdirplus.name(), "READDIRPLUS");
        assert!(Proc::Write.changes() && !Proc::Commit.changes());
    }
}
