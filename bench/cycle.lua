-- wrk script: acquire+release cycles, one keep-alive connection per wrk thread.
--
-- Run as `wrk -t N -c N -s cycle.lua URL -- PREFIX TOKEN MODE TAG`: with one
-- connection per thread, a thread's requests are strictly sequential, so each
-- thread alternates POST (acquire) and DELETE (release) of its own resource.
-- MODE "floor" sends both to PREFIX itself (the no-database route). MODE "etcd"
-- runs the same cycle through etcd's own v3 lock API (its JSON gateway): POST
-- /v3/lock/lock with the thread's name on the lease TOKEN, then /v3/lock/unlock
-- of the key the lock answered. MODE "heartbeat" sends every request as PATCH of
-- a session's URL (its heartbeat; PREFIX lists one URL per thread, separated by
-- commas), MODE "etcd-keepalive" as a keep-alive of a lease (TOKEN lists one lease
-- per thread): each heartbeat counts as a cycle, its latency as an acquire's.
-- done() prints one line `BENCH_JSON {...}` with counts and acquire latency.

local ffi = require("ffi")
ffi.cdef [[
typedef struct { long tv_sec; long tv_nsec; } bench_timespec;
int clock_gettime(int clk_id, bench_timespec *tp);
]]
local timespec = ffi.new("bench_timespec")
local CLOCK_MONOTONIC = 1

local function now_us()
  ffi.C.clock_gettime(CLOCK_MONOTONIC, timespec)
  return tonumber(timespec.tv_sec) * 1e6 + tonumber(timespec.tv_nsec) / 1e3
end

local B64 = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"

local function base64(text)
  local out = {}
  for i = 1, #text, 3 do
    local a, b, c = text:byte(i, i + 2)
    local n = a * 65536 + (b or 0) * 256 + (c or 0)
    for k = 3, 0, -1 do
      local index = math.floor(n / 64 ^ k) % 64 + 1
      table.insert(out, B64:sub(index, index))
    end
    if not b then out[#out - 1], out[#out] = "=", "=" elseif not c then out[#out] = "=" end
  end
  return table.concat(out)
end

-- The thread's own entry of a comma-separated list.
local function own(list)
  local items = {}
  for item in list:gmatch("[^,]+") do table.insert(items, item) end
  return items[(id - 1) % #items + 1]
end

local threads = {}
local count = 0

function setup(thread)
  count = count + 1
  thread:set("id", count)
  table.insert(threads, thread)
end

function init(args)
  local prefix, token, mode, tag = args[1], args[2], args[3], args[4] or "x"
  local owner = "wrk-" .. id
  path = mode == "floor" and prefix or (prefix .. "bench." .. tag .. "." .. id)
  headers = {
    ["Content-Type"] = "application/json",
    ["Authorization"] = "Bearer " .. token,
  }
  acquire_body = '{"owner":"' .. owner .. '","ttl":30}'
  release_body = '{"owner":"' .. owner .. '"}'
  etcd = mode == "etcd"
  if etcd then
    -- etcd reads an Authorization header as its own auth token: none here.
    headers = { ["Content-Type"] = "application/json" }
    path = "/v3/lock/lock"
    acquire_body = '{"name":"' .. base64("bench." .. tag .. "." .. id) ..
      '","lease":"' .. token .. '"}'
  end
  if mode == "heartbeat" then
    heartbeat = wrk.format("PATCH", own(prefix), headers, "{}")
  elseif mode == "etcd-keepalive" then
    heartbeat = wrk.format(
      "POST", "/v3/lease/keepalive", { ["Content-Type"] = "application/json" },
      '{"ID":"' .. own(token) .. '"}')
  end
  releasing = false
  started = 0
  buckets = {} -- acquire latency histogram, 10 microsecond buckets
  acquires, releases, bad = 0, 0, 0
end

function request()
  if heartbeat then
    started = now_us()
    return heartbeat
  end
  if releasing and etcd then
    return wrk.format("POST", "/v3/lock/unlock", headers, release_body)
  end
  if releasing then
    return wrk.format("DELETE", path, headers, release_body)
  end
  started = now_us()
  return wrk.format("POST", path, headers, acquire_body)
end

function response(status, headers, body)
  if heartbeat then
    local bucket = math.floor((now_us() - started) / 10)
    buckets[bucket] = (buckets[bucket] or 0) + 1
    acquires, releases = acquires + 1, releases + 1
    if status ~= 200 then bad = bad + 1 end
    return
  end
  if releasing then
    releases = releases + 1
    if status ~= 204 and status ~= 200 then bad = bad + 1 end
  else
    local bucket = math.floor((now_us() - started) / 10)
    buckets[bucket] = (buckets[bucket] or 0) + 1
    acquires = acquires + 1
    if status ~= 200 then bad = bad + 1 end
    if etcd then
      release_body = '{"key":"' .. (body:match('"key":"([^"]+)"') or "") .. '"}'
    end
  end
  releasing = not releasing
end

function done(summary, latency, requests)
  local merged, total_acquires, total_releases, total_bad = {}, 0, 0, 0
  for _, thread in ipairs(threads) do
    for bucket, n in pairs(thread:get("buckets")) do
      merged[bucket] = (merged[bucket] or 0) + n
    end
    total_acquires = total_acquires + thread:get("acquires")
    total_releases = total_releases + thread:get("releases")
    total_bad = total_bad + thread:get("bad")
  end
  local keys = {}
  for bucket in pairs(merged) do table.insert(keys, bucket) end
  table.sort(keys)
  local function percentile(p)
    local wanted, seen = p / 100 * total_acquires, 0
    for _, bucket in ipairs(keys) do
      seen = seen + merged[bucket]
      if seen >= wanted then return (bucket + 0.5) * 10 / 1000 end
    end
    return 0
  end
  local e = summary.errors
  io.write(string.format(
    'BENCH_JSON {"duration_s": %.6f, "requests": %d, "acquires": %d, ' ..
    '"releases": %d, "bad_status": %d, "socket_errors": %d, ' ..
    '"acquire_p50_ms": %.3f, "acquire_p99_ms": %.3f, ' ..
    '"request_p50_ms": %.3f, "request_p99_ms": %.3f}\n',
    summary.duration / 1e6, summary.requests, total_acquires, total_releases,
    total_bad, e.connect + e.read + e.write + e.timeout,
    percentile(50), percentile(99),
    latency:percentile(50) / 1000, latency:percentile(99) / 1000))
end
