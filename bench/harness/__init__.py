"""What every benchmark shares: starting the targets, driving load at them, and reading the figures.

- `targets`: `Targets`, the servers of one run (mock upstream, reference pass-through,
  memproxy from any checkout, a process of the script's own) in one kept work directory,
  stopped together; `throwaway_postgres`; `config` writes memproxy's config file.
- `mock_upstream`, `reference_proxy`, `json_mock`: the servers memproxy is measured beside
  or against; each runs on its own.
- `loadgen`: the load client (raw asyncio + httptools, keep-alive, closed loops);
  `measure`: a load measured in slices, with its latency, stream and CPU figures;
  `memory`: seeding a user's memories and waiting until memproxy serves them warm;
  `rounds`: targets taking turns side by side, and a burst on one of them.
- `proc`: what /proc says (CPU by process or thread, resident memory, open files);
  `pyspy`: sampled profiles.
- `figures`: percentiles, medians, per-round differences and ratios, timing a call;
  `report`: tables, PASS/FAIL lines (`Criterion`), the JSON object a run ends with.

The harness imports nothing of a benchmark script; scripts import it as `harness.<module>`
(bench/ is on the path of a script run as `python bench/<script>.py`).
"""
