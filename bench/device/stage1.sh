set -e
mkdir -p /root/stash && cp .dev1/compiler.xz.aa /root/stash/ && ls -la /root/stash && nproc
# The fuzz slice (bench/device/fuzz_slice.py prepare .fuzz), when the call carries it: the round's call has no room.
if [ -d .fuzz ]; then rm -rf /root/stash/fuzz && cp -r .fuzz /root/stash/fuzz && du -sh /root/stash/fuzz; fi
# The tuning candidates (prepare.sh), when the call carries them: stashed like the fuzz slice, so the round's
# call carries the whole .dev2/.
# prepare.sh packs them with xz (.candidates/candidates.tar.xz); a folder of plain ones is copied as it is.
if [ -d .candidates ]; then
    rm -rf /root/stash/candidates && mkdir -p /root/stash/candidates
    if [ -f .candidates/candidates.tar.xz ]; then xz -d < .candidates/candidates.tar.xz | tar -C /root/stash/candidates -xf -
    else cp -r .candidates/. /root/stash/candidates/; fi
    du -sh /root/stash/candidates
fi
