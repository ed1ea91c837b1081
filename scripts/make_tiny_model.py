"""Write a tiny random-weight llama GGUF whose tool calls llama.cpp's grammar forces.

Run in a venv with `gguf` and `numpy` (scripts/build-llamacpp.sh makes one). The tokenizer is the
real Qwen2 BPE vocabulary that llama.cpp ships for its own tests; the chat template is Qwen2.5's
Hermes-style one. The output layer gets a strong transition `<tool_call>` -> "\\n" and
`</tool_call>` -> `<|im_end|>` (one embedding direction per marker) so that, with the server's
`--logit-bias` on `<tool_call>` and `<|im_end|>`, a call turn ends in real grammar-forced calls.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import gguf
import numpy as np

N_VOCAB = 151936
N_EMBD = 64
N_FF = 128
N_LAYER = 2
N_HEAD = 4
ADDED = {
    151643: ("<|endoftext|>", 3),
    151644: ("<|im_start|>", 3),
    151645: ("<|im_end|>", 3),
    151657: ("<tool_call>", 4),
    151658: ("</tool_call>", 4),
    151667: ("<think>", 4),
    151668: ("</think>", 4),
}
TOOL_CALL, END_TOOL_CALL, IM_END = 151657, 151658, 151645


def field(reader: gguf.GGUFReader, name: str) -> list[Any]:
    f = reader.fields[name]
    if hasattr(f, "contents"):
        return list(f.contents())
    out: list[Any] = []
    for i in f.data:
        part = f.parts[i]
        out.append(bytes(part).decode() if part.dtype == np.uint8 else part.tolist()[0])
    return out


def vocabulary(src: Path) -> tuple[list[str], list[int], list[str]]:
    reader = gguf.GGUFReader(str(src / "models" / "ggml-vocab-qwen2.gguf"))
    tokens = [str(t) for t in field(reader, "tokenizer.ggml.tokens")]
    types = [int(t) for t in field(reader, "tokenizer.ggml.token_type")]
    merges = [str(m) for m in field(reader, "tokenizer.ggml.merges")]
    while len(tokens) < N_VOCAB:
        tokens.append(f"[PAD{len(tokens)}]")
        types.append(5)
    tokens, types = tokens[:N_VOCAB], types[:N_VOCAB]
    for tid, (text, kind) in ADDED.items():
        tokens[tid], types[tid] = text, kind
    return tokens, types, merges


def weights(tokens: list[str]) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(15)

    def rnd(*shape: int, std: float = 0.02) -> np.ndarray:
        return (rng.standard_normal(shape) * std).astype(np.float32)

    embd, out = rnd(N_VOCAB, N_EMBD, std=0.1), rnd(N_VOCAB, N_EMBD, std=0.1)
    newline = tokens.index("Ċ")
    for axis, (src, dst) in enumerate(((TOOL_CALL, newline), (END_TOOL_CALL, IM_END))):
        embd[:, axis] = 0.0  # only the marker points along its axis
        embd[src] = 0.0
        embd[src, axis] = 4.0
        out[:, axis] = 0.0
        out[dst, axis] = 8.0
    t: dict[str, np.ndarray] = {"token_embd.weight": embd, "output.weight": out}
    t["output_norm.weight"] = np.ones(N_EMBD, np.float32)
    for i in range(N_LAYER):
        b = f"blk.{i}."
        t[b + "attn_norm.weight"] = np.ones(N_EMBD, np.float32)
        t[b + "ffn_norm.weight"] = np.ones(N_EMBD, np.float32)
        for name in ("attn_q", "attn_k", "attn_v", "attn_output"):
            t[b + name + ".weight"] = rnd(N_EMBD, N_EMBD)
        t[b + "ffn_gate.weight"] = rnd(N_FF, N_EMBD)
        t[b + "ffn_up.weight"] = rnd(N_FF, N_EMBD)
        t[b + "ffn_down.weight"] = rnd(N_EMBD, N_FF)
    return t


def write(src: Path, out: Path) -> None:
    tokens, types, merges = vocabulary(src)
    template = (src / "models" / "templates" / "Qwen-Qwen2.5-7B-Instruct.jinja").read_text()
    w = gguf.GGUFWriter(str(out), "llama")
    w.add_name("streamer-tiny")
    w.add_context_length(8192)
    w.add_embedding_length(N_EMBD)
    w.add_block_count(N_LAYER)
    w.add_feed_forward_length(N_FF)
    w.add_head_count(N_HEAD)
    w.add_head_count_kv(N_HEAD)
    w.add_rope_dimension_count(N_EMBD // N_HEAD)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_file_type(0)
    w.add_vocab_size(N_VOCAB)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("qwen2")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.add_bos_token_id(151643)
    w.add_eos_token_id(IM_END)
    w.add_pad_token_id(151643)
    w.add_add_bos_token(False)
    w.add_chat_template(template)
    for name, arr in weights(tokens).items():
        w.add_tensor(name, arr)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--src", type=Path, required=True)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    write(args.src, args.out)


if __name__ == "__main__":
    main()
