#!/usr/bin/env bash
# Serves DIR with nfs-ganesha (FSAL VFS) on 127.0.0.1, NFSv3 over TCP only,
# NFS on PORT and MOUNT on PORT+1, in the foreground: the peer of layerfs in
# tools/kernel-bench/run, inside its guest (which has no network). ganesha
# will not serve without registering with rpcbind, so one is started if none
# runs. Its log goes to /run/ganesha.log.
# usage: tools/kernel-bench/serve-ganesha.sh PORT DIR
set -euo pipefail
port=$1 dir=$2
mkdir -p "$dir" /var/lib/nfs/ganesha /var/run/ganesha
cat >/run/ganesha.conf <<CONF
NFS_CORE_PARAM { Bind_addr = 127.0.0.1; NFS_Port = $port; MNT_Port = $((port + 1));
  Protocols = 3; Enable_NLM = false; Enable_RQUOTA = false; Enable_UDP = false; }
NFS_KRB5 { Active_krb5 = false; }
EXPORT { Export_Id = 1; Path = $dir; Pseudo = $dir; Access_Type = RW; Squash = No_Root_Squash;
  Protocols = 3; Transports = TCP; SecType = sys; FSAL { Name = VFS; } }
LOG { Default_Log_Level = EVENT; }
CONF
pgrep -x rpcbind >/dev/null || rpcbind || echo "serve-ganesha: rpcbind did not start" >&2
: >/run/ganesha.log
tail -F /run/ganesha.log | grep -v DBUS >&2 &
exec ganesha.nfsd -F -f /run/ganesha.conf -L /run/ganesha.log -p /run/ganesha.pid
