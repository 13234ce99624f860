"""The engine's vLLM-compatible HTTP API, one module per endpoint as vLLM's `vllm/entrypoints/openai` is laid out:

- `serving`: what every generation endpoint shares (`EngineServing`: model check, chat rendering, context
  limits, the backend run in a worker thread as a stream of `Step`s, logprob shapes), request parsing and
  vLLM's error body;
- `chat_completion`: POST /v1/chat/completions;  `completion`: POST /v1/completions;
- `models`: GET /v1/models;  `tokenization`: POST /tokenize, POST /detokenize;
- `health`: GET /health, GET /version;  `metrics`: GET /metrics;
- `control`: the test and bench controls of the scripted backend and of forced replies.

The request models are `tracefleet.engine.protocol`'s. `tracefleet.engine.server.create_app` puts the routers
together (as vLLM's `api_server.build_app` does).
"""
