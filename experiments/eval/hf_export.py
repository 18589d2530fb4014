"""Export a baseline checkpoint to Hugging Face `transformers` `LlamaForCausalLM`:
`python -m experiments.eval.hf_export <run dir or ckpt> <out dir>`. q/k weights copy as they
are (rotate-half RoPE is HF's convention); w1 = gate, w3 = up, w2 = down. The cross-check of the
architecture and the adapter: HF logits match ours to 1e-4. The config carries both
`rope_theta` (transformers < 5) and `rope_parameters` (>= 5). A Free Transformer has no HF
counterpart and is refused; bad input: one line, exit 2, nothing written.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch

from common import arms
from common.errors import ArgParser, UsageError, cli
from common.io import umask, unwritable
from common.paths import RunDir
from experiments.corpus.tokenizer import EOS
from model import load_checkpoint
from model.checkpoint import CheckpointError


def llama_config(cfg: object, eos_id: int | None):  # -> transformers.LlamaConfig
    from transformers import LlamaConfig

    kw = dict(vocab_size=cfg.vocab_size, hidden_size=cfg.dim, intermediate_size=cfg.ffn_dim,
              num_hidden_layers=cfg.n_layers, num_attention_heads=cfg.n_heads,
              num_key_value_heads=cfg.n_kv_heads, head_dim=cfg.head_dim,
              max_position_embeddings=cfg.max_seq_len, rms_norm_eps=cfg.norm_eps,
              tie_word_embeddings=cfg.tie_embeddings, attention_bias=False, mlp_bias=False,
              hidden_act="silu", bos_token_id=eos_id, eos_token_id=eos_id,
              pad_token_id=eos_id, torch_dtype="float32")
    hf = LlamaConfig(**kw, rope_theta=cfg.rope_theta)
    # transformers >= 5 keeps RoPE settings in rope_parameters; older ones in rope_theta
    rp = getattr(hf, "rope_parameters", None)
    if isinstance(rp, dict):
        rp["rope_theta"] = cfg.rope_theta
        rp.setdefault("rope_type", "default")
    return hf


def state_dict_to_hf(sd: dict[str, torch.Tensor], n_layers: int,
                     tied: bool) -> dict[str, torch.Tensor]:
    out = {"model.embed_tokens.weight": sd["tok_emb.weight"],
           "model.norm.weight": sd["norm.weight"]}
    if not tied:
        out["lm_head.weight"] = sd["output.weight"]
    names = {"attn_norm.weight": "input_layernorm.weight",
             "mlp_norm.weight": "post_attention_layernorm.weight",
             "attn.wq.weight": "self_attn.q_proj.weight",
             "attn.wk.weight": "self_attn.k_proj.weight",
             "attn.wv.weight": "self_attn.v_proj.weight",
             "attn.wo.weight": "self_attn.o_proj.weight",
             "mlp.w1.weight": "mlp.gate_proj.weight", "mlp.w3.weight": "mlp.up_proj.weight",
             "mlp.w2.weight": "mlp.down_proj.weight"}
    for i in range(n_layers):
        for ours, theirs in names.items():
            out[f"model.layers.{i}.{theirs}"] = sd[f"blocks.{i}.{ours}"]
    return out


def to_llama(model: torch.nn.Module, eos_id: int | None = None,
             attn_implementation: str | None = None):  # -> transformers.LlamaForCausalLM
    """Our baseline as an in-memory LlamaForCausalLM holding a copy of its weights."""
    from transformers import LlamaForCausalLM

    cfg = model.cfg
    if arms.of_model(cfg.latent_bits).latent:  # only the baseline's class is a Llama
        raise UsageError("hf_export: a Free Transformer has no LlamaForCausalLM equivalent; "
                         "export a baseline (latent_bits=0)")
    hc = llama_config(cfg, eos_id)
    hf = (LlamaForCausalLM(hc) if attn_implementation is None else
          LlamaForCausalLM._from_config(hc, attn_implementation=attn_implementation)).eval()
    sd = {k: v.detach().clone() for k, v in model.state_dict().items()}
    missing, unexpected = hf.load_state_dict(
        state_dict_to_hf(sd, cfg.n_layers, cfg.tie_embeddings), strict=False)
    missing = [m for m in missing if not (cfg.tie_embeddings and m == "lm_head.weight")]
    if missing or unexpected:
        raise RuntimeError(f"hf_export: missing {missing}, unexpected {unexpected}")
    if cfg.tie_embeddings:
        hf.tie_weights()
    return hf


def _umask_files(out: Path) -> None:
    """Give the written files the mode the umask allows (some writers use 0600 temp files)."""
    mask = umask()
    for f in out.iterdir():
        if f.is_file():
            f.chmod(0o666 & ~mask)


def export(ckpt: RunDir | str | os.PathLike, out_dir: str | os.PathLike) -> Path:
    """Write a LlamaForCausalLM (safetensors) and a fast tokenizer to out_dir."""
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast

    out = Path(out_dir)
    if (bad := unwritable(out)) is not None:  # before any work
        raise UsageError(f"OUT={out}: {bad}")
    run = ckpt if isinstance(ckpt, RunDir) else RunDir.at(ckpt)
    ck = load_checkpoint(run.checkpoint())
    cfg, ref = ck.config, ck.tokenizer
    hf = to_llama(ck.model, ref.get("eos_id") if isinstance(ref, dict) else None)
    if not (isinstance(ref, dict) and ref.get("type") == "tokenizers"):
        raise UsageError("hf_export: needs a checkpoint with a `tokenizers` BPE tokenizer")
    eos_id = ref.get("eos_id")
    out.mkdir(parents=True, exist_ok=True)
    hf.save_pretrained(out)
    tok = PreTrainedTokenizerFast(tokenizer_object=Tokenizer.from_str(ref["json"]),
                                  eos_token=EOS if eos_id is not None else None,
                                  model_max_length=cfg.max_seq_len)
    tok.save_pretrained(out)
    # older transformers read only the top-level keys: rope_theta (else the default 10000) and
    # tokenizer_class (else they guess from model_type and ask for a sentencepiece file)
    for name, extra, keys_sorted in (("config.json", {"rope_theta": float(cfg.rope_theta)}, True),
                                     ("tokenizer_config.json", {}, False)):
        path = out / name
        conf = json.loads(path.read_text(encoding="utf-8")) | extra
        conf["tokenizer_class"] = "PreTrainedTokenizerFast"
        path.write_text(json.dumps(conf, indent=2, sort_keys=keys_sorted) + "\n", encoding="utf-8")
    _umask_files(out)
    return out


def _main(argv: list[str] | None) -> int:
    ap = ArgParser(prog="python -m experiments.eval.hf_export",
                   description=__doc__.splitlines()[0])
    ap.add_argument("ckpt")
    ap.add_argument("out_dir")
    a = ap.parse_args(argv)
    try:
        print(export(a.ckpt, a.out_dir))
    except (CheckpointError, FileNotFoundError) as e:  # a missing or corrupt checkpoint
        raise UsageError(str(e)) from None
    return 0


def main(argv: list[str] | None = None) -> int:
    return cli("hf-export", lambda: _main(argv))


if __name__ == "__main__":
    sys.exit(main())
