"""Moved to `tracefleet.formats.models` (shared by the engine and the proxy's exact mode).

`python -m tracefleet.engine.models --ensure` (hack/setup.d/40-engine.sh) still works.
"""

import sys

from tracefleet.formats.models import (MODELS, TEMPLATES, ModelMissing, ModelSpec, cache_dir,  # noqa: F401
                                       ensure_tokenizer_json, gemma3_path, gguf_metadata, main, resolve_model,
                                       smollm2_path, template_source, tokenizer_json_path)

if __name__ == "__main__":
    sys.exit(main())
