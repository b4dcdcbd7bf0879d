set -e
mkdir -p /root/stash && cp .dev1/compiler.xz.aa /root/stash/ && ls -la /root/stash && nproc
# The fuzz slice (bench/device/fuzz_slice.py prepare .fuzz), when the call carries it: the round's call has no room.
if [ -d .fuzz ]; then rm -rf /root/stash/fuzz && cp -r .fuzz /root/stash/fuzz && du -sh /root/stash/fuzz; fi
# ResNet-50's tuning candidates (prepare.sh), when the call carries them: stashed like the fuzz slice, so the round's
# call carries the whole .dev2/.
if [ -d .candidates ]; then rm -rf /root/stash/candidates && cp -r .candidates /root/stash/candidates && du -sh /root/stash/candidates; fi
