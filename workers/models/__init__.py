"""Policy models: which one (``config.ModelConfig``) and its HF folder on disk (``materialize.materialize_model``).

Nothing is re-exported here: importing the package must stay light, because every config validation
(``orchestrator.config`` → ``workers.models.config``) passes through it, and ``materialize`` pulls in
transformers (seconds of import that ``--help``, the API and ``sweeps.report`` do not need).
"""
