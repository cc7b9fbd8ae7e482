"""PMI-1 wire codec, process mapping, per-task engine and rank 0's exchange (no sockets, no MPI)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from broker.job import State
from broker.pmiexchange import PmiExchange
from minicluster.proto import messages
from worker.pmi.engine import (
    VALLEN_MAX,
    Abort,
    EnterBarrier,
    JobInfo,
    Phase,
    ProtocolError,
    PutBudget,
    PutRefused,
    Reply,
    TaskEngine,
    initack_reply,
    parse_initack,
    process_mapping,
)
from worker.pmi.wire import (
    WireError,
    decode,
    encode,
    format_response,
    parse_request,
    unescape,
)

# -- wire ------------------------------------------------------------------


def test_parse_simple_command() -> None:
    req = parse_request("cmd=barrier_in\n")
    assert (req.cmd, req.args, req.multi) == ("barrier_in", {}, False)


def test_parse_init_with_args_any_order_and_extra_spaces() -> None:
    req = parse_request("cmd=init   pmi_subversion=1 pmi_version=1  \n")
    assert req.cmd == "init"
    assert req.args == {"pmi_version": "1", "pmi_subversion": "1"}
    assert req.get_int("pmi_version") == 1


def test_parse_splits_on_first_equals_only() -> None:
    req = parse_request("cmd=put kvsname=k key=a value=x=y==z\n")
    assert req.args["value"] == "x=y==z"


def test_parse_long_value_beyond_1024() -> None:
    value = "ab" * 2000
    req = parse_request(f"cmd=put kvsname=k key=bc value={value}\n")
    assert req.args["value"] == value


def test_parse_empty_value_is_valid() -> None:
    assert parse_request("cmd=put kvsname=k key=a value=\n").args["value"] == ""


def test_parse_mcmd_is_multi() -> None:
    req = parse_request("mcmd=spawn\n")
    assert (req.cmd, req.multi) == ("spawn", True)


def test_escaped_space_stays_in_value_verbatim() -> None:
    req = parse_request("cmd=put kvsname=k key=a value=hello\\ world\n")
    assert req.args["value"] == "hello\\ world"
    assert unescape(req.args["value"]) == "hello world"


def test_bare_spaces_continue_previous_value() -> None:
    req = parse_request("cmd=abort exitcode=3 message=it went wrong\n")
    assert req.args == {"exitcode": "3", "message": "it went wrong"}


@pytest.mark.parametrize(
    "line",
    [
        "",
        "\n",
        "   \n",
        "barrier_in\n",
        "key=value cmd=init\n",
        "cmd=\n",
        "cmd=put =x\n",
        "cmd=put key=a key=b\n",
        "cmd=a\ncmd=b\n",
    ],
)
def test_malformed_lines_raise_wire_error(line: str) -> None:
    with pytest.raises(WireError):
        parse_request(line)


def test_get_int_errors_are_wire_errors() -> None:
    req = parse_request("cmd=init pmi_version=one\n")
    with pytest.raises(WireError):
        req.get_int("pmi_version")
    with pytest.raises(WireError):
        req.get_int("pmi_subversion")


def test_format_response() -> None:
    assert format_response("barrier_out", rc=0) == "cmd=barrier_out rc=0\n"
    assert format_response("get_result", rc=0, value="a=b") == "cmd=get_result rc=0 value=a=b\n"
    with pytest.raises(WireError):
        format_response("get_result", value="a\nb")


def test_non_utf8_bytes_round_trip() -> None:
    raw = b"cmd=put kvsname=k key=a value=\xff\xfe\n"
    assert encode(decode(raw)) == raw


# -- process mapping -------------------------------------------------------


@pytest.mark.parametrize(
    ("layout", "expected"),
    [
        ([4], "(vector,(0,1,4))"),
        ([4, 4], "(vector,(0,2,4))"),
        ([2, 2], "(vector,(0,2,2))"),
        ([3, 2], "(vector,(0,1,3),(1,1,2))"),
        ([2, 2, 4, 4], "(vector,(0,2,2),(2,2,4))"),
        ([1, 2, 1], "(vector,(0,1,1),(1,1,2),(2,1,1))"),
    ],
)
def test_process_mapping_layouts(layout: list[int], expected: str) -> None:
    assert process_mapping(layout) == expected


def test_process_mapping_too_long_is_unknown() -> None:
    # RFC 13: a mapping that does not fit a value is sent as the empty string.
    layout = [1 + (i % 2) for i in range(VALLEN_MAX)]
    assert process_mapping(layout) == ""


@pytest.mark.parametrize("layout", [[], [0], [2, 0, 2], [-1]])
def test_process_mapping_rejects_empty_nodes(layout: list[int]) -> None:
    with pytest.raises(ValueError):
        process_mapping(layout)


# -- PMI_PORT handshake ----------------------------------------------------


def test_initack() -> None:
    assert parse_initack("cmd=initack pmiid=3\n") == 3
    with pytest.raises(WireError):
        parse_initack("cmd=init pmi_version=1 pmi_subversion=1\n")
    assert initack_reply(3, 8) == (
        "cmd=initack rc=0\ncmd=set size=8\ncmd=set rank=3\ncmd=set debug=0\n"
    )


# -- engine ----------------------------------------------------------------

JOB = JobInfo(kvsname="mc-job-7", size=4, appnum=0)


def make_engine(kvs: dict[str, str] | None = None) -> TaskEngine:
    return TaskEngine(1, JOB, kvs if kvs is not None else {"PMI_process_mapping": "(vector,(0,1,4))"})


def reply(effects: list) -> str:
    assert len(effects) == 1 and isinstance(effects[0], Reply), effects
    return effects[0].text


def ready_engine(kvs: dict[str, str] | None = None) -> TaskEngine:
    engine = make_engine(kvs)
    engine.handle("cmd=init pmi_version=1 pmi_subversion=1\n")
    assert engine.phase is Phase.READY
    return engine


def test_init_handshake() -> None:
    engine = make_engine()
    text = reply(engine.handle("cmd=init pmi_version=1 pmi_subversion=1\n"))
    assert text == "cmd=response_to_init rc=0 pmi_version=1 pmi_subversion=1\n"
    assert engine.phase is Phase.READY


def test_init_newer_client_is_offered_1_1() -> None:
    text = reply(make_engine().handle("cmd=init pmi_version=2 pmi_subversion=0\n"))
    assert text == "cmd=response_to_init rc=0 pmi_version=1 pmi_subversion=1\n"


def test_init_older_client_is_refused() -> None:
    engine = make_engine()
    text = reply(engine.handle("cmd=init pmi_version=0 pmi_subversion=0\n"))
    assert text.startswith("cmd=response_to_init rc=-1 ")
    assert engine.phase is Phase.NEW


def test_commands_before_init_are_protocol_errors() -> None:
    effects = make_engine().handle("cmd=get_maxes\n")
    assert isinstance(effects[0], ProtocolError)


def test_info_queries() -> None:
    engine = ready_engine()
    assert reply(engine.handle("cmd=get_maxes\n")) == (
        "cmd=maxes rc=0 kvsname_max=256 keylen_max=256 vallen_max=1024\n"
    )
    assert reply(engine.handle("cmd=get_appnum\n")) == "cmd=appnum rc=0 appnum=0\n"
    assert reply(engine.handle("cmd=get_my_kvsname\n")) == "cmd=my_kvsname rc=0 kvsname=mc-job-7\n"
    assert reply(engine.handle("cmd=get_universe_size\n")) == "cmd=universe_size rc=0 size=4\n"


def test_process_mapping_is_served_as_a_key() -> None:
    text = reply(ready_engine().handle("cmd=get kvsname=mc-job-7 key=PMI_process_mapping\n"))
    assert text == "cmd=get_result rc=0 value=(vector,(0,1,4))\n"


def test_missing_key_is_rc_minus_one_not_an_error() -> None:
    engine = ready_engine()
    text = reply(engine.handle("cmd=get kvsname=mc-job-7 key=PMI_hwloc_xmlfile\n"))
    assert text == "cmd=get_result rc=-1 msg=not_found\n"
    assert engine.phase is Phase.READY


def test_put_is_local_until_barrier_then_visible_via_kvs() -> None:
    kvs: dict[str, str] = {}
    engine = ready_engine(kvs)
    long_value = "x" * 1000
    assert reply(engine.handle(f"cmd=put kvsname=mc-job-7 key=bc-1 value={long_value}\n")) == (
        "cmd=put_result rc=0\n"
    )
    # The task sees its own put before the barrier.
    assert reply(engine.handle("cmd=get kvsname=mc-job-7 key=bc-1\n")) == (
        f"cmd=get_result rc=0 value={long_value}\n"
    )
    effects = engine.handle("cmd=barrier_in\n")
    assert effects == [EnterBarrier({"bc-1": long_value})]
    assert engine.phase is Phase.IN_BARRIER
    # Any request while waiting breaks PMI-1's lock-step rule.
    assert isinstance(engine.handle("cmd=get_maxes\n")[0], ProtocolError)
    kvs.update({"bc-1": long_value, "bc-2": "peer"})
    assert engine.barrier_done(True) == Reply("cmd=barrier_out rc=0\n")
    assert engine.phase is Phase.READY
    assert reply(engine.handle("cmd=get kvsname=mc-job-7 key=bc-2\n")) == "cmd=get_result rc=0 value=peer\n"
    # The next barrier carries only the puts made since.
    assert engine.handle("cmd=barrier_in\n") == [EnterBarrier({})]


def test_puts_share_the_job_budget_of_this_node() -> None:
    budget = PutBudget(size=4, local_tasks=2)
    assert (budget.max_keys, budget.task_keys) == (512 * 1024, 256 * 1024)  # half the job's room here
    budget.max_bytes, budget.task_bytes = 25, 20  # small room, the same rules
    engines = [TaskEngine(rank, JOB, {}, budget) for rank in (0, 1)]
    for engine in engines:
        engine.handle("cmd=init pmi_version=1 pmi_subversion=1\n")
    assert reply(engines[0].handle("cmd=put kvsname=mc-job-7 key=a value=123456789\n")) == "cmd=put_result rc=0\n"
    # Past the task's 20 bytes: refused, and counted nowhere.
    effects = engines[0].handle("cmd=put kvsname=mc-job-7 key=b value=123456789xx\n")
    assert effects[0] == Reply("cmd=put_result rc=-1 msg=put_limit_of_a_task_reached_(262144_puts,_20_bytes)\n")
    assert isinstance(effects[1], PutRefused) and (engines[0].put_bytes, budget.bytes) == (10, 10)
    assert reply(engines[1].handle("cmd=put kvsname=mc-job-7 key=c value=123456789\n")) == "cmd=put_result rc=0\n"
    # Within the second task's own room but past the job's 25 bytes on this node.
    text = reply(engines[1].handle("cmd=put kvsname=mc-job-7 key=d value=12345678\n")[:1])
    assert text.startswith("cmd=put_result rc=-1 msg=put_limit_of_the_job_reached")
    assert engines[1].handle("cmd=barrier_in\n") == [EnterBarrier({"c": "123456789"})]


def test_failed_exchange_answers_barrier_with_error() -> None:
    engine = ready_engine()
    engine.handle("cmd=barrier_in\n")
    assert engine.barrier_done(False).text.startswith("cmd=barrier_out rc=-1 ")
    with pytest.raises(RuntimeError):
        engine.barrier_done(True)


def test_wrong_kvsname_is_refused() -> None:
    engine = ready_engine()
    assert reply(engine.handle("cmd=put kvsname=other key=a value=1\n")).startswith("cmd=put_result rc=-1")
    assert reply(engine.handle("cmd=get kvsname=other key=a\n")).startswith("cmd=get_result rc=-1")


def test_put_without_key_is_a_protocol_error() -> None:
    assert isinstance(ready_engine().handle("cmd=put kvsname=mc-job-7 value=1\n")[0], ProtocolError)


def test_finalize_and_reinit() -> None:
    engine = ready_engine()
    assert reply(engine.handle("cmd=finalize\n")) == "cmd=finalize_ack rc=0\n"
    assert engine.phase is Phase.FINALIZED
    reply(engine.handle("cmd=init pmi_version=1 pmi_subversion=1\n"))
    assert engine.phase is Phase.READY


def test_abort() -> None:
    engine = ready_engine()
    effects = engine.handle("cmd=abort exitcode=3 message=rank\\ 1\\ gave\\ up\n")
    assert effects == [Abort(exit_code=3, message="rank 1 gave up")]
    assert engine.phase is Phase.ABORTED
    assert engine.handle("cmd=barrier_in\n") == []


def test_abort_with_bad_code_defaults_to_one() -> None:
    assert ready_engine().handle("cmd=abort exitcode=x\n") == [Abort(exit_code=1, message="")]


def test_spawn_is_declined_after_its_body() -> None:
    engine = ready_engine()
    assert engine.handle("mcmd=spawn\n") == []
    for line in ("nprocs=2\n", "execname=/bin/true\n", "argcnt=0\n"):
        assert engine.handle(line) == []
    text = reply(engine.handle("endcmd\n"))
    assert text.startswith("cmd=spawn_result rc=-1 ")
    assert engine.phase is Phase.READY


def test_name_service_is_declined() -> None:
    engine = ready_engine()
    assert reply(engine.handle("cmd=publish_name service=s port=p\n")).startswith("cmd=publish_result rc=-1")
    assert reply(engine.handle("cmd=lookup_name service=s\n")).startswith("cmd=lookup_result rc=-1")


@pytest.mark.parametrize("line", ["garbage\n", "cmd=frobnicate\n", "mcmd=other\n", "cmd=init\n"])
def test_malformed_or_unknown_requests_become_protocol_errors(line: str) -> None:
    engine = make_engine() if line.startswith("cmd=init") else ready_engine()
    effects = engine.handle(line)
    assert len(effects) == 1 and isinstance(effects[0], ProtocolError)


# -- rank 0's exchange -------------------------------------------------------


def test_rank0_forgets_the_parts_of_an_ended_job() -> None:
    sent: list[tuple[str, int]] = []
    jobs = {job: SimpleNamespace(id=job, ranks={0, 1}, ending=False, state=State.RUN, running=2) for job in (1, 2)}
    exchange = PmiExchange(SimpleNamespace(jobs=jobs), lambda kind, rank, body: sent.append((kind, rank)))
    exchange.on_put(0, messages.PmiPut(1, 0, kvs={"k": "v" * 1000}))  # rank 1 never joins this barrier
    exchange.on_put(0, messages.PmiPut(2, 0, kvs={"k": "v"}))
    jobs[1].running = 0  # its tasks ended: the broker's results handler tells the exchange
    exchange.drop_ended()
    assert list(exchange._parts) == [(2, "kvs", 0)]
    del jobs[2]  # gone from the broker altogether: dropped at the next put
    exchange.on_put(0, messages.PmiPut(3, 0, kvs={}))
    assert list(exchange._parts) == [] and sent == [("error", 0)]  # job 3 is unknown


def test_rank0_ends_a_group_operation_once_every_node_of_its_members_sent_its_part() -> None:
    sent: list[tuple[str, int, dict[str, Any]]] = []
    jobs = {1: SimpleNamespace(id=1, ranks={0, 1, 2}, ending=False, state=State.RUN, running=3)}
    exchange = PmiExchange(SimpleNamespace(jobs=jobs), lambda kind, rank, body: sent.append((kind, rank, body)))

    def part(rank: int, seq: int, nodes: list[int], ctxid: bool = True, status: int = 0) -> None:
        exchange.on_group(rank, messages.PmixGroup(1, "g", seq, "construct", nodes, ctxid, status, bytes([rank])), 3)

    part(2, 0, [0, 2])
    assert sent == []  # rank 0's part is missing; rank 1 holds no member
    part(0, 0, [0, 2])
    assert [(kind, rank) for kind, rank, _ in sent] == [("pmix-group-done", 2), ("pmix-group-done", 0)]
    first = sent[0][2]
    assert first == sent[1][2] and first["status"] == 0 and first["data"] == b"\x00\x02"
    assert first["ctxid"] >> 32 == 3  # the epoch in the upper half: unique across broker restarts
    sent.clear()
    part(0, 1, [0, 2])
    part(2, 1, [0, 2])
    assert sent[0][2]["ctxid"] not in (None, first["ctxid"])  # a new id for each group
    sent.clear()
    part(0, 2, [0, 2], ctxid=False)  # the parts disagree: every member is told, none gets an id
    part(2, 2, [0, 2], ctxid=True)
    assert [(body["status"], body.get("ctxid")) for _, _, body in sent] == [(-27, None), (-27, None)]
    sent.clear()
    part(0, 3, [0, 1, 2], status=-1)  # a failed local part fails the operation
    part(1, 3, [0, 1, 2])
    part(2, 3, [0, 1, 2])
    assert [body["status"] for _, _, body in sent] == [-1, -1, -1]
    sent.clear()
    part(0, 4, [0, 5])  # rank 5 does not run the job
    assert [(kind, rank) for kind, rank, _ in sent] == [("error", 0)]
    sent.clear()
    part(2, 5, [0, 2])  # never completed: forgotten with the job
    jobs[1].running = 0
    exchange.drop_ended()
    assert exchange._groups == {}
