"""The raw samples an engine reading keeps (and a recording stores every scrape) are keyed
``name{label="value",...}``: that key is exposition syntax, so a label value holding a
quote, a backslash or a newline must be written escaped, as the engine wrote it — else the
key cannot be read back, and two different label sets can make the same key."""

from __future__ import annotations

from llmtop.engines.exposition import iter_samples
from llmtop.engines.recognise import recognise

TEXT = r'''vllm:num_requests_running{model_name="m"} 1
vllm:lora_requests_info{path="C:\\models\\a",note="say \"hi\"\nbye"} 2
vllm:lora_requests_info{a="x\",b=\"y"} 3
vllm:lora_requests_info{a="x",b="y"} 4
'''


def test_raw_keys_are_escaped_and_read_back_to_the_same_labels() -> None:
    r = recognise(TEXT, 0.0)
    samples = list(iter_samples(TEXT))
    assert len(r.raw) == len(samples) == 4  # no two label sets share a key
    for key, value in r.raw.items():
        [(name, labels, v)] = list(iter_samples(f"{key} {value}\n"))
        assert (name, labels, v) in samples
    assert r.raw[r'vllm:lora_requests_info{note="say \"hi\"\nbye",path="C:\\models\\a"}'] == 2.0
