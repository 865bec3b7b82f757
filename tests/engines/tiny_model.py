"""A tiny random-weight Llama over Kimi K2.5's real vocabulary, for the real-engine tier.

    ENGINE_PYTHON tests/engines/tiny_model.py OUT_DIR THINK_CLOSE_ID END_OF_TURN_ID

Run by the engine's own interpreter (it has torch and transformers; kimipipe's venv has
neither): writes OUT_DIR/config.json, generation_config.json and model.safetensors. The
tier links the tokenizer files and the chat template beside them (tests/engines/tier_vllm.py).

Random weights sample near-uniformly over the 163,840 IDs, so answers are mostly
non-canonical segmentations of their text, and `</think>` and `<|im_end|>` would almost
never come. A constant bias sets their rate: every embedding has its first dimension at a
constant (the final norm keeps it about constant), and only the lm_head rows of those two
IDs read it strongly. Every request of the tier has the same `seed`, so the same random
draws: with near-uniform logits every answer would be the same tokens, its `</think>` and
`<|im_end|>` at the same places (a first tier run: 22 of 22 answers 33 tokens, all ending
in the reasoning). So the weights are not small (EMB_STD, HEAD_STD: the logits vary by
several units with the context) and the two rows keep part of their random weights (their
rate varies with the context). THINK_BIAS and END_BIAS aim at about 1 token in 200 and 1
in 150 on average (set by sampling this model in torch, as vLLM samples, offline; the
shares of each ending are the tier's to report).
"""

import sys

import torch
from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

VOCAB = 163_840  # Kimi K2.5's (tiktoken.model's 163,584 ranks and the added tokens)
CONSTANT = 8.0  # the first dimension of every embedding
EMB_STD = 1.0  # the other dimensions of the embeddings
HEAD_STD = 0.5  # the lm_head: logits' spread ~2.7 (context-dependent sampling)
BIAS_ROW_SCALE = 0.6  # what the two biased rows keep of their random weights
THINK_BIAS = 1.56
END_BIAS = 1.61


def main(out: str, think_close: int, end_of_turn: int) -> None:
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=2, intermediate_size=128,
                         max_position_embeddings=4096, tie_word_embeddings=False,
                         eos_token_id=end_of_turn, bos_token_id=None, pad_token_id=None,
                         torch_dtype="float32")
    model = LlamaForCausalLM(config)
    with torch.no_grad():
        model.model.embed_tokens.weight.normal_(0, EMB_STD)
        model.model.embed_tokens.weight[:, 0] = CONSTANT
        head = model.lm_head.weight
        head.normal_(0, HEAD_STD)
        head[:, 0] = 0.0
        for row, bias in ((think_close, THINK_BIAS), (end_of_turn, END_BIAS)):
            head[row, 1:] *= BIAS_ROW_SCALE
            head[row, 0] = bias
    model.save_pretrained(out, safe_serialization=True)
    # the end of turn stops generation (finish_reason stop), as Kimi's own config says
    GenerationConfig(eos_token_id=[end_of_turn]).save_pretrained(out)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]))
