"""An agent written with the `openai` client library, trained as it is: `--agent-function-path
examples/openai_agent/agent.py:run` (docs/agents.md).

The job gives each episode the rollout worker's OpenAI-compatible endpoint and a key of the episode's own; the
agent talks to it as to any Chat Completions server. Here: it asks the task, then asks the model to say its answer
again ("answer ?") -- two calls, one conversation, so the episode's sample holds both turns (the second call's
prompt extends the first: the user's follow-up is masked, both answers trained). What it returns -- the final
answer -- is graded by the job's reward (`--rm-type exact_match` against the label).
"""

from openai import AsyncOpenAI

_clients: dict[str, AsyncOpenAI] = {}


def client_for(base_url: str, api_key: str) -> AsyncOpenAI:
    """One HTTP client per endpoint, with this episode's key (making a client per episode builds an SSL context each
    time: seconds of a busy event loop when a hundred episodes start at once)."""
    if base_url not in _clients:
        _clients[base_url] = AsyncOpenAI(base_url=base_url, api_key="-", max_retries=0, timeout=600)
    return _clients[base_url].with_options(api_key=api_key)


async def run(sample, base_url: str, api_key: str) -> str:
    client = client_for(base_url, api_key)
    messages = [{"role": "user", "content": str(sample.prompt)}]
    first = await client.chat.completions.create(model="policy", messages=messages, max_tokens=1)
    said = first.choices[0].message.content or ""
    messages += [{"role": "assistant", "content": said}, {"role": "user", "content": "answer ?"}]
    second = await client.chat.completions.create(model="policy", messages=messages, max_tokens=1)
    return (second.choices[0].message.content or "").strip()
