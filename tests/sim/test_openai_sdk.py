"""The official openai SDK streams chat and completions from the sim and reads usage."""

from openai import AsyncOpenAI

from servelens.sim.testing import run_sim
from servelens.sim.tokenizer import count_tokens, make_text


async def test_sdk_streams_chat_with_usage() -> None:
    async with run_sim(model="sim-llama") as sim:
        client = AsyncOpenAI(base_url=sim.url + "/v1", api_key="unused", max_retries=0)
        prompt = make_text(120, "sdk")
        stream = await client.chat.completions.create(
            model="sim-llama", messages=[{"role": "user", "content": prompt}], max_tokens=16, stream=True,
            stream_options={"include_usage": True}, extra_body={"ignore_eos": True},
        )
        text, usage, finish = "", None, None
        async for chunk in stream:
            if chunk.choices:
                text += chunk.choices[0].delta.content or ""
                finish = chunk.choices[0].finish_reason or finish
            if chunk.usage is not None:
                usage = chunk.usage
        assert usage is not None and usage.prompt_tokens == 120 and usage.completion_tokens == 16
        assert usage.prompt_tokens_details is not None and usage.prompt_tokens_details.cached_tokens == 0
        assert count_tokens(text) == 16 and finish == "length"
        again = await client.chat.completions.create(
            model="sim-llama", messages=[{"role": "user", "content": prompt}], max_tokens=4,
            extra_body={"ignore_eos": True})
        assert again.usage is not None and again.usage.prompt_tokens_details is not None
        assert again.usage.prompt_tokens_details.cached_tokens == 112
        assert again.choices[0].message.content and count_tokens(again.choices[0].message.content) == 4
        await client.close()


async def test_sdk_streams_completions_and_lists_models() -> None:
    async with run_sim() as sim:
        client = AsyncOpenAI(base_url=sim.url + "/v1", api_key="unused", max_retries=0)
        models = await client.models.list()
        assert [m.id for m in models.data] == [sim.model]
        stream = await client.completions.create(
            model=sim.model, prompt="Once upon a time,", max_tokens=7, stream=True,
            stream_options={"include_usage": True}, extra_body={"ignore_eos": True},
        )
        pieces, usage = [], None
        async for chunk in stream:
            if chunk.choices:
                pieces.append(chunk.choices[0].text)
            if chunk.usage is not None:
                usage = chunk.usage
        assert len(pieces) == 7 and usage is not None
        assert (usage.prompt_tokens, usage.completion_tokens) == (5, 7)
        await client.close()
