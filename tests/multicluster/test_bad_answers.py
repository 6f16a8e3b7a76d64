"""A server that answers as no API server does is paused: the pause's schedule (a fake clock),
and through a real client, that a paused server is not even connected to."""

from __future__ import annotations

import pytest
from aiohttp import web

from multicluster.badanswers import BadAnswers
from multicluster.errors import BadResponse, NotFound
from multicluster.resources import PODS
from tests.multicluster.test_hostile_server import serve  # noqa: F401 (a fixture)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def paused() -> tuple[BadAnswers, Clock]:
    clock = Clock()
    return BadAnswers("c2", clock=clock), clock


def test_nothing_is_paused_before_a_bad_answer(paused):
    answers, _ = paused
    answers.check("GET /x")  # does not raise


def test_the_pause_doubles_with_each_bad_answer_up_to_five_minutes(paused):
    answers, clock = paused
    pauses = []
    for _ in range(12):
        pauses.append(answers.record(BadResponse("not JSON")))
        clock.now = answers.until  # asked again as soon as allowed, and bad again
    assert pauses == [1, 2, 4, 8, 16, 32, 64, 128, 256, 300, 300, 300]


def test_while_paused_requests_fail_at_once_saying_why(paused):
    answers, clock = paused
    answers.record(BadResponse("GET /api/v1/pods on c2: the answer is not JSON (not quoted)"))
    clock.now += 0.5
    with pytest.raises(BadResponse) as refused:
        answers.check("WATCH /api/v1/pods on c2")
    assert str(refused.value).startswith("WATCH /api/v1/pods on c2: not asked for another 0s")
    assert "the answer is not JSON" in str(refused.value)
    clock.now += 0.5
    answers.check("WATCH /api/v1/pods on c2")  # the pause is over


def test_answers_to_requests_made_before_the_pause_do_not_lengthen_it(paused):
    answers, clock = paused
    assert answers.record(BadResponse("one")) == 1
    clock.now += 0.25
    assert answers.record(BadResponse("two, already under way")) == 0.75
    clock.now = answers.until
    assert answers.record(BadResponse("three")) == 2


def test_ten_minutes_without_a_bad_answer_and_it_starts_over(paused):
    answers, clock = paused
    for _ in range(5):
        answers.record(BadResponse("bad"))
        clock.now = answers.until
    assert answers.pause == 16
    clock.now += 600
    assert answers.record(BadResponse("bad again")) == 1


def test_the_error_kept_holds_no_frames():
    """What a failed read had in hand (up to a whole answer) is not kept alive by the pause."""
    answers = BadAnswers("c2")
    try:
        payload = bytearray(1 << 20)  # noqa: F841 (held by this frame)
        raise BadResponse("too large")
    except BadResponse as e:
        answers.record(e)
    assert answers.last is not None
    assert answers.last.__traceback__ is None


async def test_a_paused_server_is_not_even_connected_to(serve):  # noqa: F811
    asked = []

    async def handler(request: web.Request) -> web.Response:
        asked.append(request.path)
        return web.Response(body=b"<html>not an API server</html>", content_type="text/html")

    client = await serve(handler)
    with pytest.raises(BadResponse, match="not JSON"):
        await client.list(PODS)
    for _ in range(3):
        with pytest.raises(BadResponse, match="not asked for another"):
            await client.list(PODS)
        with pytest.raises(BadResponse, match="not asked for another"):
            async for _event in client.watch(PODS):
                pass
    assert asked == ["/api/v1/pods"]


async def test_errors_an_api_server_gives_pause_nothing(serve):  # noqa: F811
    async def handler(_request: web.Request) -> web.Response:
        status = {"kind": "Status", "code": 404, "reason": "NotFound", "message": "nope"}
        return web.json_response(status, status=404)

    client = await serve(handler)
    for _ in range(3):
        with pytest.raises(NotFound):
            await client.list(PODS)
    assert client.bad_answers.last is None
