set -e
mkdir -p /root/stash && cp .dev1/compiler.xz.aa /root/stash/ && ls -la /root/stash && nproc
# The fuzz slice (bench/device/fuzz_slice.py prepare .fuzz), when the call carries it: the round's call has no room.
if [ -d .fuzz ]; then rm -rf /root/stash/fuzz && cp -r .fuzz /root/stash/fuzz && du -sh /root/stash/fuzz; fi
