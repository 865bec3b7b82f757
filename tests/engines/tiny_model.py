"""A tiny random-weight Llama over Kimi K2.5's real vocabulary, for the real-engine tier.

    ENGINE_PYTHON tests/engines/tiny_model.py OUT_DIR THINK_CLOSE_ID END_OF_TURN_ID

Run by the engine's own interpreter (it has torch and transformers; kimipipe's venv has
neither): writes OUT_DIR/config.json, generation_config.json and model.safetensors. The
tier links the tokenizer files and the chat template beside them (tests/engines/tier_vllm.py).

What the tier needs from it, and how the weights give it:
- Answers shaped as Kimi's are: reasoning, one `</think>`, content, `<|im_end|>`, of varied
  lengths, within the tier's max_tokens. The ordinary tokens are split in two halves by
  their ID's parity: even ones are "reasoning" tokens, odd ones "content" tokens. Every
  embedding carries its half in one dimension (STATE), and every lm_head row reads it, so
  after a reasoning token the next one is a reasoning token or `</think>` (about 1 in
  THINK_EVERY), and after `</think>` or a content token the next one is a content token or
  `<|im_end|>` (about 1 in END_EVERY); the prompt ends in `<think>`, whose half is
  "reasoning". Now and then (about 1 reasoning token in END_IN_REASONING_EVERY) the
  reasoning ends at `<|im_end|>`, no `</think>`: a turn the template cannot lay out,
  which both of kp-tokenize's paths (the server's IDs, the logprobs' bytes) must reject.
  The other added tokens are never sampled.
- Answers that differ between prompts although every request of the tier has the same
  `seed` (so the same random draws at each step: a model whose next token depends only on
  the last one would give every prompt, all ending in `<think>`, the same answer, as the
  first two tier runs found, whose layers kept their near-zero initial weights). The first
  layer's attention averages the whole context (zero queries and keys: equal scores) and
  adds it, scaled by CONTEXT_GAIN, to the random dimensions, so each prompt moves every
  logit by a few units. Its MLPs and the second layer add nothing.
- The two biases are set by measuring this model's logits (calibrate): the log of the
  summed weight of a half, on random contexts in that half, plus the wanted log-odds.
Nothing here is a language model: the text is random tokens, mostly non-canonical
segmentations, with split UTF-8 characters among them (what the tier exercises).
"""

import math
import sys

import torch
from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

VOCAB = 163_840  # Kimi K2.5's (tiktoken.model's 163,584 ranks and the added tokens)
ORDINARY = 163_584  # IDs below are tiktoken's ranks; from here on the added tokens
HIDDEN = 64
CONSTANT = 20.0  # dimension 0 of every embedding: what the biases read
STATE = 20.0  # dimension 1: +STATE for the reasoning half, -STATE for the content half
HALF_GAP = 14.0  # how far (in logits) the other half is pushed down
HEAD_STD = 0.7  # the lm_head's random dimensions: the logits' spread within a half
CONTEXT_GAIN = 24.0  # the averaged context added back (the answers' variety)
THINK_EVERY = 60  # about one reasoning token in this many is followed by `</think>`
END_EVERY = 45  # about one content token in this many is followed by `<|im_end|>`
END_IN_REASONING_EVERY = 400  # a reasoning token followed by `<|im_end|>` (no `</think>`)
ROW_STD = 0.3  # the random dimensions of those two rows: their odds' spread with the context
NEVER = -60.0


def build(think_close: int, end_of_turn: int) -> LlamaForCausalLM:
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=VOCAB, hidden_size=HIDDEN, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=2, intermediate_size=128,
                         max_position_embeddings=4096, tie_word_embeddings=False,
                         eos_token_id=end_of_turn, bos_token_id=None, pad_token_id=None,
                         torch_dtype="float32")
    model = LlamaForCausalLM(config)
    ids = torch.arange(VOCAB)
    reasoning_half = (ids % 2 == 0) | (ids >= ORDINARY)  # the prompt's `<think>` included
    reasoning_half[think_close] = False
    with torch.no_grad():
        emb = model.model.embed_tokens.weight
        emb.normal_(0, 1.0)
        emb[:, 0] = CONSTANT
        emb[:, 1] = torch.where(reasoning_half, STATE, -STATE)
        head = model.lm_head.weight
        head.normal_(0, HEAD_STD)
        head[:, 0] = 0.0
        head[:, 1] = torch.where(ids % 2 == 0, 1.0, -1.0)  # scaled in calibrate
        head[ORDINARY:] = 0.0
        head[ORDINARY:, 0] = NEVER
        for layer in model.model.layers:
            for w in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.o_proj,
                      layer.mlp.down_proj):
                w.weight.zero_()
        first = model.model.layers[0].self_attn
        first.v_proj.weight.copy_(torch.eye(HIDDEN))
        first.v_proj.weight[:2] = 0.0  # the constant and the half stay the token's own
        first.o_proj.weight.copy_(torch.eye(HIDDEN) * CONTEXT_GAIN)
        first.o_proj.weight[:2] = 0.0
    calibrate(model, think_close, end_of_turn)
    return model


def final_hidden(model, contexts: torch.Tensor) -> torch.Tensor:
    return model.model(input_ids=contexts).last_hidden_state[:, -1]


def calibrate(model, think_close: int, end_of_turn: int) -> None:
    """Scale the half-reading column so the halves are HALF_GAP apart, then set the two
    rows (constant, half) so `</think>` has odds 1:THINK_EVERY after a reasoning token
    and none after a content one, and `<|im_end|>` 1:END_EVERY after a content token and
    1:END_IN_REASONING_EVERY after a reasoning one."""
    g = torch.Generator().manual_seed(1)
    head = model.lm_head.weight
    with torch.no_grad():
        states = {}
        for name, parity in (("reasoning", 0), ("content", 1)):
            ctx = torch.randint(0, ORDINARY // 2, (16, 80), generator=g) * 2 + parity
            states[name] = final_hidden(model, ctx)
        h1 = states["reasoning"][:, 1].mean().item()
        head[:ORDINARY, 1] *= HALF_GAP / (2 * h1)
        lse = {name: torch.logsumexp(h @ head[:ORDINARY].T, dim=1).mean().item()
               for name, h in states.items()}
        mean = {name: h[:, :2].mean(0) for name, h in states.items()}
        for row, on, off, every, off_odds in (
                (think_close, "reasoning", "content", THINK_EVERY, NEVER),
                (end_of_turn, "content", "reasoning", END_EVERY,
                 -math.log(END_IN_REASONING_EVERY - 1))):
            # its random dimensions kept (ROW_STD): its odds move with the context, so the
            # answers do not all end their reasoning at the same step under one seed
            head[row] = torch.randn(HIDDEN, generator=g) * ROW_STD
            head[row, :2] = 0.0
            moved = {name: (h @ head[row]).mean().item() for name, h in states.items()}
            a = torch.stack([mean[on], mean[off]]).double()
            b = torch.tensor([lse[on] - math.log(every - 1) - moved[on],
                              lse[off] + off_odds - moved[off]]).double()
            head[row, :2] = torch.linalg.solve(a, b).float()


def main(out: str, think_close: int, end_of_turn: int) -> None:
    model = build(think_close, end_of_turn)
    model.save_pretrained(out, safe_serialization=True)
    # the end of turn stops generation (finish_reason stop), as Kimi's own config says
    GenerationConfig(eos_token_id=[end_of_turn]).save_pretrained(out)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]))
