"""memproxy: an OpenAI-compatible reverse proxy that gives LLM applications long-term memory."""

import os

# numpy scores vectors one request at a time, off the event loop, beside other requests:
# a BLAS thread pool per process would take every core for one product of a few MB and
# fight the server's own threads. Set before anything under proxy/ imports numpy; a value
# already in the environment wins.
for _name in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "VECLIB_MAXIMUM_THREADS",
              "NUMEXPR_NUM_THREADS"):
    os.environ.setdefault(_name, "1")
del _name
