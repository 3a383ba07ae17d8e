#!/usr/bin/env bash
# Make a local PostgreSQL 15 with the pgvector extension available for the
# test suite (Debian bookworm, run as root).
#
# Idempotent: when the cluster is up and pgvector is installed it only makes
# sure `CREATE EXTENSION vector` has been run in database `test` and prints a
# single line.  Otherwise it:
#   1. installs postgresql-15 / postgresql-server-dev-15 if missing (with the
#      cluster stopped, because installing the dev package can upgrade a
#      running postgresql-15),
#   2. builds pgvector from Debian trixie's *source* package (bookworm has no
#      pgvector package), fetched from the Debian mirror already configured in
#      /etc/apt/sources.list*, using a private apt source list and lists dir
#      so the system's apt configuration is not touched,
#   3. starts cluster 15/main, creates database `test`, runs
#      CREATE EXTENSION IF NOT EXISTS vector in it and checks a vector query.
# Exits non-zero with a message starting "ensure_postgres: ERROR:" on failure.
#
# Environment overrides:
#   AMFS_DEBIAN_MIRROR  Debian mirror base URI to fetch the trixie source from
#                       (default: every bookworm mirror found in apt's sources)
set -euo pipefail

PG_MAJOR=15
PG_CLUSTER=main
PG_HOST=127.0.0.1
PG_PORT=5432
PG_DB="test"
PG_BIN=/usr/lib/postgresql/${PG_MAJOR}/bin
PG_CONFIG_BIN=${PG_BIN}/pg_config
SRC_SUITE=trixie
LOCK_FILE=/var/lock/amfs-ensure-postgres.lock
export PGCONNECT_TIMEOUT=5 DEBIAN_FRONTEND=noninteractive

say() { echo "ensure_postgres: $*" >&2; }

WORK=""
LOG=/dev/null
cleanup() { if [[ -n "$WORK" ]]; then rm -rf "$WORK"; fi; }
trap cleanup EXIT

die() {
    say "ERROR: $*"
    if [[ -s "$LOG" ]]; then
        say "---- last lines of ${LOG##*/} ----"
        tail -n 25 "$LOG" >&2 || true
    fi
    exit 1
}

# psql over TCP as the test suite connects (trust auth expected).
tcp_psql() {
    psql -X -q -h "$PG_HOST" -p "$PG_PORT" -U postgres -v ON_ERROR_STOP=1 "$@"
}

vector_available() {
    command -v psql >/dev/null 2>&1 || return 1
    [[ "$(tcp_psql -d "$PG_DB" -tAc \
        "select 1 from pg_available_extensions where name='vector'" 2>/dev/null)" == 1 ]]
}

create_extension_tcp() {
    tcp_psql -d "$PG_DB" -c \
        "SET client_min_messages = warning; CREATE EXTENSION IF NOT EXISTS vector" \
        >/dev/null 2>&1
}

# ---------------------------------------------------------------- fast path
if vector_available && create_extension_tcp; then
    say "PostgreSQL ${PG_MAJOR} + pgvector ready at ${PG_HOST}:${PG_PORT}/${PG_DB}"
    exit 0
fi

# ---------------------------------------------------------------- slow path
[[ "$(id -u)" == 0 ]] || die "PostgreSQL/pgvector not ready and not running as root, cannot install"
command -v apt-get >/dev/null 2>&1 || die "apt-get not found (this script targets Debian bookworm)"

# Serialise concurrent invocations (e.g. parallel test runners), then re-check.
exec 9>"$LOCK_FILE"
flock -w 900 9 || die "timed out waiting for $LOCK_FILE"
if vector_available && create_extension_tcp; then
    say "PostgreSQL ${PG_MAJOR} + pgvector ready at ${PG_HOST}:${PG_PORT}/${PG_DB}"
    exit 0
fi

WORK="$(mktemp -d /tmp/ensure_postgres.XXXXXX)"
chmod 755 "$WORK"
LOG="$WORK/ensure_postgres.log"
: >"$LOG"

pkg_installed() {
    [[ "$(dpkg-query -W -f='${db:Status-Status}' "$1" 2>/dev/null)" == installed ]]
}

cluster_status() {  # prints online / down / "" (no such cluster)
    command -v pg_lsclusters >/dev/null 2>&1 || return 0
    pg_lsclusters -h 2>/dev/null |
        awk -v v="$PG_MAJOR" -v c="$PG_CLUSTER" '$1==v && $2==c {print $4; exit}'
}

APT_UPDATED=0
apt_update() {
    if [[ $APT_UPDATED == 0 ]]; then
        say "apt-get update"
        apt-get -q -o DPkg::Lock::Timeout=300 update >>"$LOG" 2>&1 || die "apt-get update failed"
        APT_UPDATED=1
    fi
}

vector_files_installed() {
    [[ -x "$PG_CONFIG_BIN" ]] || return 1
    [[ -f "$("$PG_CONFIG_BIN" --sharedir)/extension/vector.control" ]]
}

# ---- 1. packages (installed while the cluster is stopped)
need_pkgs=()
pkg_installed postgresql-${PG_MAJOR} || need_pkgs+=("postgresql-${PG_MAJOR}")
if ! vector_files_installed; then
    pkg_installed postgresql-server-dev-${PG_MAJOR} || need_pkgs+=("postgresql-server-dev-${PG_MAJOR}")
    command -v make >/dev/null 2>&1 || need_pkgs+=(make)
    command -v gcc >/dev/null 2>&1 || need_pkgs+=(gcc)
    command -v dpkg-source >/dev/null 2>&1 || need_pkgs+=(dpkg-dev)
fi

if ((${#need_pkgs[@]})); then
    if [[ "$(cluster_status)" == online ]]; then
        say "stopping cluster ${PG_MAJOR}/${PG_CLUSTER} before installing packages"
        pg_ctlcluster --skip-systemctl-redirect "$PG_MAJOR" "$PG_CLUSTER" stop >>"$LOG" 2>&1 ||
            die "could not stop cluster ${PG_MAJOR}/${PG_CLUSTER}"
    fi
    apt_update
    say "installing ${need_pkgs[*]}"
    apt-get -q -y -o DPkg::Lock::Timeout=300 install --no-install-recommends "${need_pkgs[@]}" \
        >>"$LOG" 2>&1 || die "apt-get install ${need_pkgs[*]} failed"
fi
[[ -x "$PG_CONFIG_BIN" ]] || die "$PG_CONFIG_BIN missing after install"

# ---- 2. build pgvector from Debian trixie's source package
debian_mirrors() {
    if [[ -n "${AMFS_DEBIAN_MIRROR:-}" ]]; then
        echo "${AMFS_DEBIAN_MIRROR%/}"
        return
    fi
    local f files=()
    [[ -f /etc/apt/sources.list ]] && files+=(/etc/apt/sources.list)
    for f in /etc/apt/sources.list.d/*.list /etc/apt/sources.list.d/*.sources; do
        [[ -f "$f" ]] && files+=("$f")
    done
    ((${#files[@]})) || return 0
    # Mirrors serving the plain bookworm suite (not -security/-updates):
    # one-line "deb [opts] URI bookworm ..." entries and deb822 stanzas.
    awk '
        function flush() {
            if (uris != "" && enabled && suite_ok)
                { n = split(uris, u, /[ \t]+/); for (i = 1; i <= n; i++) if (u[i] != "") print u[i] }
            uris = ""; enabled = 1; suite_ok = 0
        }
        FNR == 1 { flush() }
        /^[ \t]*#/ { next }
        /^[ \t]*$/ { flush(); next }
        /^deb(-src)?[ \t]/ {
            line = $0; sub(/\[[^]]*\]/, "", line); n = split(line, w, /[ \t]+/)
            if (n >= 3 && w[3] == "bookworm") print w[2]
            next
        }
        tolower($1) == "uris:"    { v = $0; sub(/^[^:]*:[ \t]*/, "", v); uris = v }
        tolower($1) == "suites:"  { for (i = 2; i <= NF; i++) if ($i == "bookworm") suite_ok = 1 }
        tolower($1) == "enabled:" { if (tolower($2) == "no") enabled = 0 }
        END { flush() }
    ' "${files[@]}" | sed 's:/*$::' | awk '!seen[$0]++'
}

fetch_pgvector_source() {  # $1 = mirror; extracts into $WORK/src
    local mirror=$1 keyring=/usr/share/keyrings/debian-archive-keyring.gpg
    local aptdir="$WORK/apt"
    rm -rf "$aptdir" "$WORK/src"
    mkdir -p "$aptdir/lists/partial" "$WORK/src"
    {
        echo "Types: deb-src"
        echo "URIs: $mirror"
        echo "Suites: $SRC_SUITE"
        echo "Components: main"
        [[ -f "$keyring" ]] && echo "Signed-By: $keyring"
    } >"$aptdir/trixie.sources"
    # Private source list + lists dir + no binary caches: the system's apt
    # state is left exactly as it was.
    local opts=(
        -o "Dir::Etc::SourceList=$aptdir/trixie.sources"
        -o "Dir::Etc::SourceParts=/dev/null"
        -o "Dir::State::Lists=$aptdir/lists"
        -o "Dir::Cache::pkgcache=" -o "Dir::Cache::srcpkgcache="
        -o "APT::Sandbox::User=root"
    )
    apt-get -q "${opts[@]}" update >>"$LOG" 2>&1 || return 1
    (cd "$WORK/src" && apt-get -q "${opts[@]}" source pgvector) >>"$LOG" 2>&1 || return 1
}

if ! vector_files_installed; then
    mapfile -t mirrors < <(debian_mirrors)
    ((${#mirrors[@]})) || die "no Debian bookworm mirror found in /etc/apt/sources.list*; set AMFS_DEBIAN_MIRROR"
    fetched=""
    for m in "${mirrors[@]}"; do
        say "fetching pgvector source package ($SRC_SUITE) from $m"
        if fetch_pgvector_source "$m"; then fetched=$m; break; fi
        say "could not fetch from $m"
    done
    [[ -n "$fetched" ]] || die "could not fetch the $SRC_SUITE pgvector source package"

    srcdir="$(find "$WORK/src" -mindepth 1 -maxdepth 1 -type d -name 'pgvector-*' | head -n 1)"
    [[ -n "$srcdir" ]] || die "pgvector source tree not found after apt-get source"
    say "building ${srcdir##*/} against PostgreSQL ${PG_MAJOR}"
    make -C "$srcdir" -j"$(nproc)" PG_CONFIG="$PG_CONFIG_BIN" OPTFLAGS="" >>"$LOG" 2>&1 ||
        die "pgvector build failed"
    make -C "$srcdir" PG_CONFIG="$PG_CONFIG_BIN" OPTFLAGS="" install >>"$LOG" 2>&1 ||
        die "pgvector make install failed"
    vector_files_installed || die "vector.control not installed after make install"
fi

# ---- 3. cluster up, database + extension
status="$(cluster_status)"
if [[ -z "$status" ]]; then
    say "creating cluster ${PG_MAJOR}/${PG_CLUSTER}"
    pg_createcluster -p "$PG_PORT" "$PG_MAJOR" "$PG_CLUSTER" >>"$LOG" 2>&1 ||
        die "pg_createcluster ${PG_MAJOR} ${PG_CLUSTER} failed"
    status="$(cluster_status)"
fi
if [[ "$status" != online ]]; then
    say "starting cluster ${PG_MAJOR}/${PG_CLUSTER}"
    pg_ctlcluster --skip-systemctl-redirect "$PG_MAJOR" "$PG_CLUSTER" start >>"$LOG" 2>&1 ||
        die "could not start cluster ${PG_MAJOR}/${PG_CLUSTER} (see /var/log/postgresql/postgresql-${PG_MAJOR}-${PG_CLUSTER}.log)"
fi
for _ in $(seq 1 30); do
    pg_isready -q -h "$PG_HOST" -p "$PG_PORT" && break
    sleep 1
done
pg_isready -q -h "$PG_HOST" -p "$PG_PORT" || die "PostgreSQL not accepting connections on ${PG_HOST}:${PG_PORT}"

# Admin work over the Unix socket as the postgres OS user (peer auth works even
# on a freshly created cluster whose pg_hba.conf does not trust TCP yet).
admin_psql() {
    (cd / && runuser -u postgres -- psql -X -q -p "$PG_PORT" -v ON_ERROR_STOP=1 "$@")
}
if [[ "$(admin_psql -d postgres -tAc "select 1 from pg_database where datname='${PG_DB}'" 2>>"$LOG")" != 1 ]]; then
    say "creating database ${PG_DB}"
    admin_psql -d postgres -c "CREATE DATABASE ${PG_DB}" >>"$LOG" 2>&1 || die "could not create database ${PG_DB}"
fi
admin_psql -d "$PG_DB" -c "SET client_min_messages = warning; CREATE EXTENSION IF NOT EXISTS vector" \
    >>"$LOG" 2>&1 || die "CREATE EXTENSION vector failed in database ${PG_DB}"

# The tests connect as postgres over TCP without a password; a freshly created
# Debian cluster wants scram there, so trust local TCP if needed.
if ! tcp_psql -d "$PG_DB" -tAc "select 1" >/dev/null 2>&1; then
    hba="$(admin_psql -d postgres -tAc "show hba_file")"
    say "enabling trust auth for ${PG_HOST} in $hba"
    tmp_hba="$WORK/pg_hba.conf"
    {
        echo "# added by amfs-server scripts/ensure_postgres.sh (local test database)"
        echo "host all all 127.0.0.1/32 trust"
        echo "host all all ::1/128 trust"
        cat "$hba"
    } >"$tmp_hba"
    cat "$tmp_hba" >"$hba"
    admin_psql -d postgres -c "select pg_reload_conf()" >>"$LOG" 2>&1 || true
    sleep 1
fi

dist="$(tcp_psql -d "$PG_DB" -tAc "select '[1,2,3]'::vector <=> '[1,2,4]'::vector" 2>>"$LOG")" ||
    die "vector query over ${PG_HOST}:${PG_PORT} as postgres failed"
[[ -n "$dist" ]] || die "vector query returned nothing"
say "PostgreSQL ${PG_MAJOR} + pgvector ready at ${PG_HOST}:${PG_PORT}/${PG_DB} (cosine distance check: $dist)"
