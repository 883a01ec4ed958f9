"""Policy weights from the learner to the vLLM engines, one module per route.

- ``object_store``: rank 0's state dict packed for Ray's object store (``HostWeights``), read by each
  engine without a copy (routes ``in_process`` and ``bytes``);
- ``broadcast``: learner rank 0 broadcasts over a process group of its own with the vLLM workers
  (route ``collective``);
- ``vllm_reload``: the engine side, loading whichever arrives into the running vLLM model.
"""
