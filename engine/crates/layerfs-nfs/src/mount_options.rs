//! The options a client mounts a layerfs export with: one place for the
//! daemon's own mounts and for the commands `layerfs serve` prints.
//! docs/mounting.md gives the reason for each.

use std::net::IpAddr;

/// Linux's kernel client, through mount(2) or `mount -t nfs`: NFSv3 over
/// TCP to `port` for both NFS and MOUNT (no rpcbind), no NLM (`nolock`:
/// locks stay local, as the server has no lock manager), and the address,
/// since the kernel resolves no names.
pub fn linux(ip: IpAddr, port: u16) -> String {
    format!("vers=3,proto=tcp,port={port},mountport={port},mountproto=tcp,nolock,addr={ip}")
}

/// macOS' `mount_nfs`: NFSv3 over TCP to `port` for NFS and MOUNT, locks
/// kept local (`locallocks`; `nolocks` would make flock fail), 1 MiB
/// transfers, a hard mount a signal can interrupt, and a source port that
/// needs no privilege.
pub fn macos(port: u16) -> String {
    format!(
        "vers=3,tcp,port={port},mountport={port},locallocks,rsize=1048576,wsize=1048576,\
         hard,intr,noresvport"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_name_nfsv3_over_tcp_on_one_port_with_local_locks() {
        let linux = linux([127, 0, 0, 1].into(), 2049);
        let macos = macos(2049);
        for options in [&linux, &macos] {
            let has = |o: &str| options.split(',').any(|x| x == o);
            assert!(
                has("vers=3") && has("port=2049") && has("mountport=2049"),
                "{options}"
            );
        }
        assert!(linux
            .split(',')
            .any(|o| o == "nolock" || o == "addr=127.0.0.1"));
        assert!(!macos.contains("nolocks"), "nolocks makes flock fail");
    }
}
