#!/usr/bin/env bash
# Writes a tiny random-weight Llama model directory for real vLLM on CPU: the repository's
# byte-level BPE tokenizer (testdata/tokenizers/tiny-llama, vocab 2048, with a chat template)
# and a 2-layer config. Weights are not needed: vLLM runs it with `--load-format dummy`.
set -euo pipefail
OUT=${1:?usage: model.sh OUT_DIR}
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
mkdir -p "$OUT"
cp "$ROOT/testdata/tokenizers/tiny-llama/tokenizer.json" "$ROOT/testdata/tokenizers/tiny-llama/tokenizer_config.json" "$OUT/"
python3 - "$OUT" <<'PY'
import json, sys, os
out = sys.argv[1]
tok = json.load(open(os.path.join(out, "tokenizer.json")))
vocab = tok["model"]["vocab"]
added = {t["content"]: t["id"] for t in tok.get("added_tokens", [])}
size = max(list(vocab.values()) + list(added.values())) + 1
bos, eos = added["<|begin_of_text|>"], added["<|eot_id|>"]
cfg = {
  "architectures": ["LlamaForCausalLM"], "model_type": "llama",
  "hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 2,
  "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 64,
  "vocab_size": size, "max_position_embeddings": 2048, "rms_norm_eps": 1e-5,
  "rope_theta": 10000.0, "hidden_act": "silu", "tie_word_embeddings": False,
  "bos_token_id": bos, "eos_token_id": eos, "torch_dtype": "bfloat16", "dtype": "bfloat16",
  "attention_bias": False, "mlp_bias": False, "initializer_range": 0.02,
}
json.dump(cfg, open(os.path.join(out, "config.json"), "w"), indent=1)
json.dump({"bos_token_id": bos, "eos_token_id": eos, "do_sample": False},
          open(os.path.join(out, "generation_config.json"), "w"), indent=1)
json.dump({"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>", "pad_token": "<|pad|>"},
          open(os.path.join(out, "special_tokens_map.json"), "w"), indent=1)
PY
