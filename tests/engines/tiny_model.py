"""A tiny random-weight Llama over Kimi K2.5's real vocabulary, for the real-engine tier.

    ENGINE_PYTHON tests/engines/tiny_model.py OUT_DIR THINK_CLOSE_ID END_OF_TURN_ID

Run by the engine's own interpreter (it has torch and transformers; kimipipe's venv has
neither): writes OUT_DIR/config.json, generation_config.json and model.safetensors. The
tier links the tokenizer files and the chat template beside them (tests/engines/tier_vllm.py).

Random weights sample near-uniformly over the 163,840 IDs, so answers are mostly
non-canonical segmentations of their text, and `</think>` and `<|im_end|>` would almost
never come. A constant bias sets their rate: every embedding has its first dimension at a
constant (the final norm keeps it about constant), and only the lm_head rows of those two
IDs read it. THINK_BIAS and END_BIAS below give `</think>` about 1 token in 300 and
`<|im_end|>` about 1 in 150, so answers of a few hundred tokens end every way the tier
needs (stop after `</think>`, stop inside the reasoning, cut by max_tokens, a second
`</think>`).
"""

import sys

import torch
from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

VOCAB = 163_840  # Kimi K2.5's (tiktoken.model's 163,584 ranks and the added tokens)
CONSTANT = 8.0  # the first dimension of every embedding
THINK_BIAS = 0.79  # x CONSTANT = logit ~6.3: e^6.3 / 163,840 ~ 1/300
END_BIAS = 0.875  # ~7.0: ~1/150


def main(out: str, think_close: int, end_of_turn: int) -> None:
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=2, intermediate_size=128,
                         max_position_embeddings=4096, tie_word_embeddings=False,
                         eos_token_id=end_of_turn, bos_token_id=None, pad_token_id=None,
                         torch_dtype="float32")
    model = LlamaForCausalLM(config)
    with torch.no_grad():
        model.model.embed_tokens.weight[:, 0] = CONSTANT
        head = model.lm_head.weight
        head[:, 0] = 0.0
        head[think_close, 0] = THINK_BIAS
        head[end_of_turn, 0] = END_BIAS
    model.save_pretrained(out, safe_serialization=True)
    # the end of turn stops generation (finish_reason stop), as Kimi's own config says
    GenerationConfig(eos_token_id=[end_of_turn]).save_pretrained(out)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]))
