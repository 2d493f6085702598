#!/usr/bin/env bash
# Fuzz the live JSON API with schemathesis against its own OpenAPI document.
#
# Serves the app with gunicorn (gthread, 2 workers) on a throwaway SQLite instance,
# creates an API token, and runs schemathesis with the checks that make the API's
# bar: no 5xx for any input, and every response (status, media type, headers, body)
# as documented. Bounded: a few minutes at most. Exits non-zero on any failure and
# always stops the server.
#
# Tunables: SCHEMATHESIS_MAX_EXAMPLES (default 100 per operation),
# SCHEMATHESIS_TIMEOUT (hard ceiling in seconds, default 180), SCHEMATHESIS_SEED.
set -euo pipefail
cd "$(dirname "$0")/.."

max_examples="${SCHEMATHESIS_MAX_EXAMPLES:-100}"
ceiling="${SCHEMATHESIS_TIMEOUT:-180}"

workdir="$(mktemp -d)"
export LOCKKEEPER_INSTANCE_PATH="$workdir/instance"
export LOCKKEEPER_BOOTSTRAP=0  # the token below is made by hand; print no admin password
# Generated acquires ask for "wait" up to the document's 30 s; a held lock would keep
# them past the request timeout. 1 s still exercises waiting (and its 400 past it).
export LOCKKEEPER_MAX_WAIT=1
# A followed event stream (/events?follow=true) would last until the request
# timeout; 1 s still checks its status, media type and headers.
export LOCKKEEPER_STREAM_MAX_SECONDS=1
# Below the kernel's ephemeral range: run beside the test suite, a port the kernel
# picked could be taken by an outgoing database connection before gunicorn binds it.
port="$(python3 -c 'from bench.ports import free_port; print(free_port())')"
base="http://127.0.0.1:$port"
server_pid=""

cleanup() {
  if [[ -n "$server_pid" ]] && kill -0 "$server_pid" 2>/dev/null; then
    kill -TERM "$server_pid"
    wait "$server_pid" 2>/dev/null || true
  fi
  rm -rf "$workdir"
}
trap cleanup EXIT

# Commands never create a database by surprise: make the SQLite file on purpose,
# then the token (its last line of output).
lockkeeper db upgrade >/dev/null
token="$(lockkeeper tokens create schemathesis | tail -n 1)"

gunicorn 'app:create_app()' -k gthread --threads 4 -w 2 --no-control-socket \
  -b "127.0.0.1:$port" --log-level warning >"$workdir/gunicorn.log" 2>&1 &
server_pid=$!

for _ in $(seq 1 60); do
  if python3 -c "import urllib.request, sys; urllib.request.urlopen(sys.argv[1], timeout=1)" \
    "$base/api/v1/openapi.json" 2>/dev/null; then
    break
  fi
  if ! kill -0 "$server_pid" 2>/dev/null; then
    echo "gunicorn exited before answering:" >&2
    cat "$workdir/gunicorn.log" >&2
    exit 1
  fi
  sleep 0.5
done

seed_option=()
if [[ -n "${SCHEMATHESIS_SEED:-}" ]]; then
  seed_option=(--seed "$SCHEMATHESIS_SEED")
fi

# Run from the throwaway folder: schemathesis keeps a cache in ./.schemathesis.
# One worker: with two threads, hypothesis describing schemathesis' filter
# lambdas calls ast.parse from both at once, and CPython 3.11's AST builder
# keeps one recursion counter per interpreter (python/cpython#106905), so a run
# failed with "SystemError: AST constructor recursion depth mismatch". The
# phases take seconds; a second worker saved none worth a red run.
status=0
(cd "$workdir" && timeout --kill-after=10 "$ceiling" schemathesis run "$base/api/v1/openapi.json" \
  --url "$base" \
  -H "Authorization: Bearer $token" \
  --checks not_a_server_error,response_schema_conformance,status_code_conformance,content_type_conformance,response_headers_conformance \
  --phases examples,coverage,fuzzing \
  --max-examples "$max_examples" \
  --workers 1 \
  --generation-database none \
  --request-timeout 10 \
  --no-color \
  "${seed_option[@]}") || status=$?

if [[ $status -ne 0 ]]; then
  if [[ $status -eq 124 ]]; then
    echo "schemathesis did not finish within ${ceiling}s" >&2
  fi
  echo "--- gunicorn log ---" >&2
  cat "$workdir/gunicorn.log" >&2
fi
exit "$status"
