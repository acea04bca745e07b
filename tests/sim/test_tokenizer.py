import pytest

from servelens.sim.tokenizer import (
    VOCAB_SIZE,
    chat_prompt_tokens,
    count_tokens,
    generated_words,
    make_text,
    split_tokens,
    tokenize,
)


def test_words_and_punctuation_are_tokens() -> None:
    assert split_tokens("Hello, world!") == ["Hello", ",", "world", "!"]
    assert count_tokens("  café  日本 ... x") == 6
    assert count_tokens("") == 0


def test_ids_are_stable_and_in_range() -> None:
    ids = tokenize("the model, the model")
    assert len(ids) == 5 and ids[0] == ids[3] and ids[1] == ids[4]
    assert all(0 <= i < VOCAB_SIZE for i in ids)
    assert tokenize("the") == [tokenize("the model")[0]]


@pytest.mark.parametrize("n", [0, 1, 7, 512, 3000])
def test_make_text_has_exactly_n_tokens_and_is_deterministic(n: int) -> None:
    text = make_text(n, ("conv", 42))
    assert count_tokens(text) == n
    assert text == make_text(n, ("conv", 42))
    assert n == 0 or text.endswith(" ")


def test_block_texts_concatenate_additively_and_share_prefixes() -> None:
    blocks = [make_text(512, h) for h in (11, 12, 13)]
    tail = "unique tail, with punctuation!"
    prompt = "".join(blocks) + tail
    assert count_tokens(prompt) == 3 * 512 + count_tokens(tail)
    other = "".join(blocks[:2]) + make_text(512, 99)
    assert tokenize(other)[:1024] == tokenize(prompt)[:1024]
    assert make_text(512, 13) != make_text(512, 99)


def test_chat_prompt_tokens_sum_contents_without_template() -> None:
    msgs = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": [{"type": "text", "text": "Hi there"}, {"type": "image_url"}]},
        {"role": "assistant", "content": None},
    ]
    assert len(chat_prompt_tokens(msgs)) == 3 + 2
    with pytest.raises(ValueError):
        chat_prompt_tokens([{"role": "user", "content": 5}])


def test_generated_words_deterministic_and_multibyte_option() -> None:
    a = generated_words(50, (0, 123))
    assert a == generated_words(50, (0, 123)) and a != generated_words(50, (1, 123))
    assert all(count_tokens(" " + w) == 1 for w in a)
    mb = generated_words(20, (0, 1), multibyte_only=True)
    assert all(len(w.encode()) > len(w) for w in mb)
