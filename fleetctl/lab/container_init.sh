#!/bin/sh
# PID 1 of a fleetctl container host (fleetctl/lab/container_image.py bakes it into the image).
# Its own host key, the fleet's authorized_keys, then "ADDRESS HOSTKEY" in the shared folder
# for the inventory writer, then sshd in the foreground (it reaps orphans: a job's escapees).
set -eu
state=${FLEETCTL_STATE:-/fleet}
name=$(hostname)
key=/etc/ssh/ssh_host_ed25519_key
[ -s "$key" ] || ssh-keygen -q -t ed25519 -N '' -C "$name" -f "$key"
mkdir -p /root/.ssh /run/sshd
chmod 700 /root/.ssh
cp "$state/authorized_keys" /root/.ssh/authorized_keys
chmod 600 /root/.ssh/authorized_keys
cat >/etc/ssh/fleetctl_sshd_config <<CONF
ListenAddress 0.0.0.0:22
HostKey $key
AuthorizedKeysFile .ssh/authorized_keys
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
PermitRootLogin prohibit-password
PermitUserEnvironment no
UsePAM no
UseDNS no
MaxSessions 256
MaxStartups 256:30:512
LoginGraceTime 30
X11Forwarding no
AllowAgentForwarding no
PrintMotd no
PrintLastLog no
Subsystem sftp internal-sftp
CONF
addr=$(ip -4 -o addr show scope global | awk '{ split($4, a, "/"); print a[1]; exit }')
mkdir -p "$state/nodes"
printf '%s %s\n' "$addr" "$(cut -d' ' -f1,2 "$key.pub")" >"$state/nodes/.$name.tmp"
mv -f "$state/nodes/.$name.tmp" "$state/nodes/$name"
exec /usr/sbin/sshd -D -e -f /etc/ssh/fleetctl_sshd_config
