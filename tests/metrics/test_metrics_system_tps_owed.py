"""System output tokens/s stays the sum of the users' while an over-attribution is owed.

Live tokens are attributed at the model's learned tokens per event; a request that ends
with fewer tokens than were attributed takes the difference back, and what its series'
current interval cannot give back is owed (``Aggregator._settle_out``). Each series owed
on its own: the request's user owed what its own interval could not give, and so did the
system — which then paid its debt with the *other* users' tokens. Alice's answer ending
(1,500 tokens over-attributed at a learned 1.5 tokens an event, the engine's usage saying
1.0) made the 10 s window's system output read 0 tok/s for about 10 s while Bob alone
streamed 142 tok/s in his row: all tokens forwarded per second, all users, read 0 while
tokens were forwarded. The system now gives back what its users give back, so its rate is
always the sum of its users' rows, and its all-time count is the engines' at once.
"""

from __future__ import annotations

from takeback_support import alice_ends_over_attributed


def users_sum(snap: dict[str, object]) -> int:
    users = snap["users"]
    assert isinstance(users, list)
    return sum(int(u["output_tokens"]) for u in users)


def test_another_users_tokens_do_not_pay_an_ended_requests_over_attribution() -> None:
    clock, agg, bob = alice_ends_over_attributed()
    for i in range(40):  # 20 s of Bob alone
        clock.advance(0.5)
        bob.tokens += 50
        bob.chunks += 50
        agg.tick()
        for w in (10, 60):
            snap = agg.snapshot(w)
            system = snap["system"]
            assert isinstance(system, dict)
            assert system["output_tokens"] == users_sum(snap), (i, w, snap["users"])
        ten = agg.snapshot(10)["system"]
        assert isinstance(ten, dict)
        if i >= 19:  # the 10 s window holds Bob alone: 135 tok/s (Alice taught 1.35)
            assert ten["output_tps"] > 100, (i, ten["output_tps"])
    total = agg.snapshot(None)
    users = {u["user"]: u["output_tokens"] for u in total["users"]}
    assert users["alice"] + users["bob"] == total["system"]["output_tokens"]
    assert users["alice"] == 3000  # the session's count is the engine's at once
