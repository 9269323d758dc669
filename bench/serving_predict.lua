-- wrk script for bench/serving_bench.sh: POST one predict body to a model.
--   wrk -t1 -c16 -d8s -s bench/serving_predict.lua http://127.0.0.1:PORT -- MODEL BODY.json
--   wrk -t1 -c16 -d8s -s bench/serving_predict.lua http://127.0.0.1:PORT/v2/health/live   (GET)
-- Prints one JSON line at the end (requests, failures, latency percentiles in ms);
-- a non-2xx answer, a socket error or a timeout counts as failed.

local model, body_file = ...

function init(args)
  model, body_file = args[1], args[2]
  if model == nil then return end  -- no arguments: GET the URL as given (the HTTP ceiling run)
  local f = assert(io.open(body_file, "rb"))
  wrk.body = f:read("*a")
  f:close()
  wrk.method = "POST"
  wrk.path = "/v1/models/" .. model .. ":predict"
  wrk.headers["Content-Type"] = "application/json"
end

function done(summary, latency, requests)
  local e = summary.errors
  local failed = e.connect + e.read + e.write + e.timeout + e.status
  local seconds = summary.duration / 1e6
  io.write(string.format(
    'WRK_JSON {"requests": %d, "failed": %d, "status_errors": %d, "socket_errors": %d, "seconds": %.3f, '
      .. '"qps": %.1f, "p50_ms": %.3f, "p90_ms": %.3f, "p99_ms": %.3f, "max_ms": %.3f}\n',
    summary.requests, failed, e.status, e.connect + e.read + e.write + e.timeout, seconds,
    (summary.requests - failed) / seconds, latency:percentile(50) / 1000, latency:percentile(90) / 1000,
    latency:percentile(99) / 1000, latency.max / 1000))
end
