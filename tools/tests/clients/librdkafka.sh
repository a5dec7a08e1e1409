#!/usr/bin/env bash
# Builds librdkafka's own test suite from the rdkafka-sys crate source (crates.io), with SSL (and so
# SASL PLAIN and SCRAM), and runs allow-listed tests against a running nvmq broker.
# Usage: librdkafka.sh <work-dir> <broker host:port> [--broker KIND] [--conf key=value]... [tests...]
#   KIND picks the allow-list's lines whose third column is KIND (none: the lines without one):
#   "full" (run without -Q: tests whose subtests are all skipped in quick mode), "sockem" (run
#   without -E: tests that put librdkafka's socket emulator between client and broker: delays,
#   stalls, cut connections), both against the usual broker, or "sasl_ssl" against a broker the
#   caller started with TLS and SCRAM, or "delayed" (as full, against a broker the caller
#   started with --group-initial-rebalance-delay). --conf gives the suite's clients their
#   settings; when they name a client key and certificate (ssl.ca.location,
#   ssl.certificate.location, ssl.key.location: PEM files), the DER and PKCS#12 forms the suite's
#   SSL test (0097) loads are made from them here, as its usual harness (trivup) does.
#   Tests named on the command line run instead of the list's.
set -euo pipefail
usage="usage: librdkafka.sh <work-dir> <host:port> [--broker KIND] [--conf k=v]... [tests...]"
work=${1:?$usage}
mkdir -p "$work"
work=$(cd "$work" && pwd)
broker=${2:?$usage}
shift 2
kind=""
conf=()
while [ $# -gt 0 ]; do
    case "$1" in
        --broker) kind=${2:?$usage}; shift 2 ;;
        --conf) conf+=("${2:?$usage}"); shift 2 ;;
        *) break ;;
    esac
done
here=$(cd "$(dirname "$0")" && pwd)
crate=rdkafka-sys
version=4.10.0+2.12.1
src="$work/librdkafka"
# A build from before SSL was enabled cannot run the SASL_SSL tests: build again.
if [ -x "$src/tests/test-runner" ] && ! grep -q '^#define WITH_SSL 1' "$src/config.h"; then
    rm -rf "$src"
fi
if [ ! -x "$src/tests/test-runner" ]; then
    # OpenSSL's headers (Debian's libssl-dev): librdkafka's SSL and its built-in SCRAM need them;
    # PLAIN is built in too. Cyrus libsasl2 would only add GSSAPI (Kerberos), which nvmq does not
    # serve.
    if ! dpkg-query -W -f='${Status}' libssl-dev 2>/dev/null | grep -q "install ok installed"; then
        if [ "$(id -u)" = 0 ]; then
            apt-get update -qq &&
                DEBIAN_FRONTEND=noninteractive apt-get install -y -qq libssl-dev >/dev/null
        else
            echo "libssl-dev is missing and this user cannot apt-get install it" >&2
            exit 1
        fi
    fi
    # Fetch the crate through cargo (its registry cache), then build from a copy.
    mkdir -p "$work/fetch/src"
    cat > "$work/fetch/Cargo.toml" <<TOML
[package]
name = "librdkafka-suite-fetch"
version = "0.0.0"
edition = "2021"
[dependencies]
$crate = "=${version%%+*}"
[workspace]
TOML
    echo 'fn main() {}' > "$work/fetch/src/main.rs"
    cargo fetch --manifest-path "$work/fetch/Cargo.toml" >/dev/null
    from=$(ls -d "${CARGO_HOME:-$HOME/.cargo}"/registry/src/*/"$crate-$version"/librdkafka | head -1)
    rm -rf "$src"
    cp -r "$from" "$src"
    (
        cd "$src"
        chmod +x configure lds-gen.py
        ./configure --enable-ssl --disable-gssapi --disable-curl --disable-zstd \
            --disable-lz4-ext >"$work/configure.log" 2>&1
        grep -q '^#define WITH_SSL 1' config.h || {
            echo "librdkafka's configure found no OpenSSL: see $work/configure.log" >&2
            exit 1
        }
        make -j2 libs >"$work/make.log" 2>&1
        make -C tests -j2 build >"$work/make-tests.log" 2>&1
    )
fi
if [ $# -eq 0 ]; then
    mapfile -t tests < <(awk -v kind="$kind" '/^[0-9][0-9][0-9][0-9] / && $3 == kind { print $1 }' \
        "$here/librdkafka.allow")
else
    tests=("$@")
fi
if [ ${#tests[@]} -eq 0 ]; then
    echo "no librdkafka tests picked (--broker ${kind:-none}): nothing would be proven" >&2
    exit 1
fi
# -L no local-only tests (they reach no broker), -K no known issues; -Q quick (a test's subtests
# that are not marked quick are skipped, silently) but for "full"; -E no socket emulator but for
# "sockem".
flags=(-L -K)
[ "$kind" = full ] || [ "$kind" = delayed ] || flags+=(-Q)
[ "$kind" = sockem ] || flags+=(-E)
# The suite's SSL test (0097) reads the client's key, certificate and CA in every encoding
# from SSL_* variables: convert the PEM files --conf names.
pem() { printf '%s\n' "${conf[@]}" | sed -n "s/^ssl\.$1\.location=//p"; }
ca=$(pem ca) cert=$(pem certificate) key=$(pem key)
if [ -n "$ca" ] && [ -n "$cert" ] && [ -n "$key" ]; then
    forms="$work/ssl-forms"
    mkdir -p "$forms"
    password=nvmq-suite-keystore
    openssl x509 -in "$ca" -outform DER -out "$forms/ca.der"
    openssl x509 -in "$cert" -outform DER -out "$forms/client.der"
    openssl pkey -in "$key" -outform DER -out "$forms/client.key.der"
    openssl pkcs12 -export -in "$cert" -inkey "$key" -certfile "$ca" \
        -passout "pass:$password" -out "$forms/client.p12"
    export SSL_all_cas_pem="$ca" SSL_ca_der="$forms/ca.der" \
        SSL_pub_pem="$cert" SSL_pub_der="$forms/client.der" \
        SSL_priv_pem="$key" SSL_priv_der="$forms/client.key.der" \
        SSL_pkcs="$forms/client.p12" SSL_password="$password"
    # The suite opens the keystore (the CA in it too) with the client's ssl.key.password.
    conf+=("ssl.key.password=$password")
fi
cd "$src/tests"
# Timeouts x3: the suite is tuned for a dedicated machine.
{
    printf 'metadata.broker.list=%s\ntest.timeout.multiplier=3\n' "$broker"
    for c in "${conf[@]}"; do printf '%s\n' "$c"; done
} > test.conf
# The suite changes itself when CI is set in the environment (test_on_ci: some tests skip, timeouts
# grow), and a skip counts as a failure here; unset it so every machine runs the same suite.
unset CI
# Most of a test's time is waiting (on timeouts, rebalances, the socket emulator's delays), so a
# few run at once: each is its own test-runner process with its own randomly named topics and
# groups. NVMQ_LIBRDKAFKA_JOBS=1 runs them one after another.
parallel=${NVMQ_LIBRDKAFKA_JOBS:-3}
results="$work/results${kind:+-$kind}"
rm -rf "$results"
mkdir -p "$results"
run_one() {
    local t=$1 start log
    start=$(date +%s)
    log="$work/test-$t${kind:+-$kind}.log"
    # A test that skips itself also exits 0: only its PASSED line counts.
    if TESTS=$t TEST_KAFKA_VERSION=3.7.0 LD_LIBRARY_PATH=../src:../src-cpp \
        timeout 300 ./test-runner "${flags[@]}" >"$log" 2>&1 &&
        grep -q "Test ${t}_[A-Za-z0-9_]* PASSED" "$log"; then
        echo "librdkafka test $t${kind:+ ($kind)} passed ($(( $(date +%s) - start )) s)"
    else
        # The log's end says why (a skip, a failed assertion, a timeout) where CI shows only
        # stdout; one echo so that lines of tests running at once do not interleave.
        echo "librdkafka test $t${kind:+ ($kind)} FAILED ($(( $(date +%s) - start )) s): see $log
$(grep -a -E "SKIPPING|FAIL|Test ${t}_" "$log" | sed 's/\x1b\[[0-9;]*m//g' | tail -n 15)"
        touch "$results/$t.failed"
    fi
}
for t in "${tests[@]}"; do
    while [ "$(jobs -rp | wc -l)" -ge "$parallel" ]; do
        wait -n || true
    done
    run_one "$t" &
done
wait
mapfile -t failed < <(cd "$results" && ls -- *.failed 2>/dev/null | sed 's/\.failed$//' | sort)
if [ ${#failed[@]} -gt 0 ]; then
    echo "failed: ${failed[*]}"
    exit 1
fi
