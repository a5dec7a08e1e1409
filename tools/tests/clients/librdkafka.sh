#!/usr/bin/env bash
# Builds librdkafka's own test suite from the rdkafka-sys crate source (crates.io) and runs the
# allow-listed tests against a running nvmq broker.
# Usage: librdkafka.sh <work-dir> <broker host:port> [tests...]   (default: librdkafka.allow)
set -euo pipefail
work=${1:?usage: librdkafka.sh <work-dir> <host:port> [tests...]}
mkdir -p "$work"
work=$(cd "$work" && pwd)
broker=${2:?usage: librdkafka.sh <work-dir> <host:port> [tests...]}
shift 2
here=$(cd "$(dirname "$0")" && pwd)
crate=rdkafka-sys
version=4.10.0+2.12.1
src="$work/librdkafka"
if [ ! -x "$src/tests/test-runner" ]; then
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
        ./configure --disable-ssl --disable-gssapi --disable-sasl --disable-curl --disable-zstd \
            --disable-lz4-ext >"$work/configure.log" 2>&1
        make -j2 libs >"$work/make.log" 2>&1
        make -C tests -j2 build >"$work/make-tests.log" 2>&1
    )
fi
if [ $# -eq 0 ]; then
    mapfile -t tests < <(grep -o '^[0-9]\{4\}' "$here/librdkafka.allow")
else
    tests=("$@")
fi
cd "$src/tests"
# Timeouts x3: the suite is tuned for a dedicated machine.
printf 'metadata.broker.list=%s\ntest.timeout.multiplier=3\n' "$broker" > test.conf
failed=()
# The suite changes itself when CI is set in the environment (test_on_ci: some tests skip, timeouts
# grow), and a skip counts as a failure here; unset it so every machine runs the same suite.
unset CI
for t in "${tests[@]}"; do
    start=$(date +%s)
    # A test that skips itself also exits 0: only its PASSED line counts.
    if TESTS=$t TEST_KAFKA_VERSION=3.7.0 LD_LIBRARY_PATH=../src:../src-cpp \
        timeout 300 ./test-runner -Q -E -L -K >"$work/test-$t.log" 2>&1 &&
        grep -q "Test ${t}_[A-Za-z0-9_]* PASSED" "$work/test-$t.log"; then
        echo "librdkafka test $t passed ($(( $(date +%s) - start )) s)"
    else
        echo "librdkafka test $t FAILED ($(( $(date +%s) - start )) s): see $work/test-$t.log"
        # The log's end says why (a skip, a failed assertion, a timeout) where CI shows only stdout.
        grep -a -E "SKIPPING|FAIL|Test ${t}_" "$work/test-$t.log" | sed 's/\x1b\[[0-9;]*m//g' | tail -n 15 || true
        failed+=("$t")
    fi
done
if [ ${#failed[@]} -gt 0 ]; then
    echo "failed: ${failed[*]}"
    exit 1
fi
