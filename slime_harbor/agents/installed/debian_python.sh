# Debian trixie's CPython 3.13 (with its own glibc and libraries) into $PREFIX, from the Debian
# archive only, for a PyPI agent that needs a newer Python than a bookworm image has and than its
# distribution's python3 gives (3.11). It exists because no registry we may use has another
# Python >= 3.12 for bookworm: CPython wheels on PyPI (pbs-installer and the like) fetch
# python-build-standalone from GitHub, `uv python install` comes from astral.sh, and building
# trixie's source package would put a toolchain into the task's image.
#
# PypiInstall.docker_script runs this in a subshell of the agent's layer (installs.py) with
# PREFIX=/opt/slime-harbor/<name>/python. The image's /usr, /lib, /etc, dpkg and apt state stay
# as they were; the interpreter is patched to load the prefix's glibc, so only the agent's Python
# process runs on it and everything it starts (bash, the task's tools) runs on the image's own.
# Needs: a Debian (bookworm or later) x86_64/arm64 image with apt-get, dpkg and the trixie archive
# keys (bookworm's debian-archive-keyring has them), root, network at build time.
set -eu
PREFIX=${PREFIX:?set PREFIX, e.g. /opt/slime-harbor/openhands-sdk/python}
SUITE=${PY_SUITE:-trixie}
# The Debian mirrors the image already uses (a cluster's mirror or proxy), else deb.debian.org.
uris() { { sed -n 's|^deb \(\[[^]]*\] \)\{0,1\}\(https\{0,1\}://[^ ]*\) .*|\2|p' /etc/apt/sources.list /etc/apt/sources.list.d/*.list
           sed -n 's|^URIs: *\(https\{0,1\}://[^ ]*\).*|\1|p' /etc/apt/sources.list.d/*.sources; } 2>/dev/null; }
MIRROR=$(uris | grep -v security | head -n1)
SECURITY=$(uris | grep security | head -n1)
MIRROR=${MIRROR:-http://deb.debian.org/debian}
SECURITY=${SECURITY:-http://deb.debian.org/debian-security}
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
mkdir -p "$W/lists/partial" "$W/archives/partial" "$W/x" "$PREFIX"
printf 'deb %s %s main\ndeb %s %s-updates main\ndeb %s %s-security main\n' \
  "$MIRROR" "$SUITE" "$MIRROR" "$SUITE" "$SECURITY" "$SUITE" > "$W/sources.list"
# apt on a throwaway tree with an empty dpkg status: it resolves the whole closure as if nothing
# were installed, downloads it, and never reads or writes the image's own state.
: > "$W/status"
APT="-o Dir::Etc::SourceList=$W/sources.list -o Dir::Etc::SourceParts=/nonexistent
 -o Dir::State::Lists=$W/lists -o Dir::State::Status=$W/status -o Dir::Cache=$W
 -o Dir::Cache::Archives=$W/archives -o Dir::Cache::pkgcache= -o Dir::Cache::srcpkgcache=
 -o APT::Sandbox::User=root -o Debug::NoLocking=1 -o APT::Get::List-Cleanup=false"
# shellcheck disable=SC2086
if ! apt-get $APT -qq update; then  # a mirror without -updates/-security: the release alone
  echo "deb $MIRROR $SUITE main" > "$W/sources.list"
  apt-get $APT -qq update  # shellcheck disable=SC2086
fi
# shellcheck disable=SC2086
DEBIAN_FRONTEND=noninteractive apt-get $APT -qq -y --no-install-recommends --download-only \
  install python3.13 python3.13-venv patchelf >/dev/null
for deb in "$W"/archives/*.deb; do
  case $(basename "$deb") in
    # runtime data the image has (or the agent does not need), and build-only tools
    debconf_*|ca-certificates_*|tzdata_*|netbase_*|media-types_*|readline-common_*|gcc-*-base_*|\
    openssl_*|openssl-provider-legacy_*|python3-setuptools-whl_*) ;;
    patchelf_*) dpkg -x "$deb" "$W/x" ;;
    *) dpkg -x "$deb" "$PREFIX" ;;
  esac
done
LIBDIR=$(dirname "$(ls "$PREFIX"/usr/lib/*-linux-gnu/libc.so.6)")
LD=$(ls "$LIBDIR"/ld-linux*.so.*)
# The interpreter gets the prefix's loader and a DT_RPATH (inherited by the extension modules
# it dlopens) to the prefix's libraries: nothing in the environment, so child processes run
# with the image's own glibc. trixie's patchelf runs on the prefix's glibc (the image's loader
# is never used for it). Two calls, rpath first: patchelf 0.18 doing both in one call, or the
# interpreter first, writes a binary that segfaults.
PATCHELF="$LD --library-path $LIBDIR:$W/x/usr/lib/x86_64-linux-gnu:$W/x/usr/lib/aarch64-linux-gnu $W/x/usr/bin/patchelf"
$PATCHELF --force-rpath --set-rpath "$LIBDIR" "$PREFIX/usr/bin/python3.13"
$PATCHELF --set-interpreter "$LD" "$PREFIX/usr/bin/python3.13"
# ensurepip: Debian's wheel dir is an absolute path; point it into the prefix.
sed -i "s|'/usr/share/python-wheels/'|'$PREFIX/usr/share/python-wheels/'|" \
  "$PREFIX"/usr/lib/python3.13/_sysconfigdata_*.py
rm -rf "$PREFIX/usr/share/doc" "$PREFIX/usr/share/man" "$PREFIX/usr/share/lintian" "$PREFIX/usr/share/locale" \
  "$PREFIX/usr/share/info" "$PREFIX/usr/share/bug" "$PREFIX/usr/share/gdb" "$PREFIX/usr/lib/x86_64-linux-gnu/gconv" \
  "$PREFIX/usr/lib/aarch64-linux-gnu/gconv" "$PREFIX/usr/lib/python3.13/test" "$PREFIX/usr/libexec" "$PREFIX/usr/sbin" \
  "$PREFIX/sbin" "$PREFIX/etc" "$PREFIX/var"
# Absolute symlinks (e.g. sitecustomize.py -> /etc/python3.13/...) would reach into the image: re-aim or drop.
find "$PREFIX" -type l | while read -r link; do
  target=$(readlink "$link")
  case $target in "$PREFIX"/*) ;; /*) if [ -e "$PREFIX$target" ]; then ln -sf "$PREFIX$target" "$link"; else rm -f "$link"; fi ;; esac
done
# $PREFIX/bin/python3 is the interpreter's name; $PREFIX/lib lets CPython find its stdlib from
# there (and from a venv, whose pyvenv.cfg says home = $PREFIX/bin).
mkdir -p "$PREFIX/bin"
ln -sfn usr/lib "$PREFIX/lib"
ln -sf ../usr/bin/python3.13 "$PREFIX/bin/python3.13"
ln -sf python3.13 "$PREFIX/bin/python3"
# A bad patch or a missing library fails the build here, not the first trial.
"$PREFIX/bin/python3" -m venv "$W/venv"
"$W/venv/bin/python" -I -c 'import sys, ssl, sqlite3, ctypes, venv, ensurepip, zlib, lzma, bz2, readline, decimal, json
assert sys.version_info >= (3, 12), sys.version
print("python", sys.version.split()[0], "base prefix", sys.base_prefix, ssl.OPENSSL_VERSION)'
