-- wrk's summary as one JSON line, in the fields of children/_load.py (latencies in µs).
done = function(summary, latency, requests)
  local errors = summary.errors.connect + summary.errors.read + summary.errors.write
    + summary.errors.status + summary.errors.timeout
  io.write(string.format(
    '{"requests": %d, "duration_us": %d, "rps": %.2f, "mean_us": %.2f, "p50_us": %d, '
      .. '"p99_us": %d, "max_us": %d, "errors": %d}\n',
    summary.requests, summary.duration, summary.requests / (summary.duration / 1e6), latency.mean,
    latency:percentile(50), latency:percentile(99), latency.max, errors))
end
