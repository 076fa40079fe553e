"""aiocop.opentelemetry when OpenTelemetry fails: a clear error at instrument(), nothing while recording.

A provider that cannot make aiocop's instruments is named in the error that
instrument() raises, and nothing is left started. Once recording, what the
SDK (or a custom provider) raises never reaches the application: it is
counted and logged once.
"""

from __future__ import annotations

import asyncio
import logging
import os
from typing import TYPE_CHECKING, Any

import pytest
from opentelemetry import trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

from aiocop._model import callbacks as _callbacks
from aiocop._model import state as _state
from aiocop._stalls import watchdog as _watchdog
from aiocop.opentelemetry import AiocopInstrumentor
from tests.conftest import reset_aiocop
from tests.support import stalls

if TYPE_CHECKING:
    from collections.abc import Iterator


@pytest.fixture
def instrumentor() -> Iterator[AiocopInstrumentor]:
    # From a clean state, whatever an earlier test of the worker left running
    # (the tests below check that nothing starts: the watchdog off before too).
    reset_aiocop()
    instrumentor = AiocopInstrumentor()
    try:
        yield instrumentor
    finally:
        if instrumentor.is_instrumented_by_opentelemetry:
            instrumentor.uninstrument()
        reset_aiocop()


class BrokenProvider:
    """A meter provider whose every meter fails (an exporter that cannot start, a misconfigured SDK)."""

    def get_meter(self, *args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("exporter endpoint refused the connection")

    def __repr__(self) -> str:
        return "<BrokenProvider>"


class NoHistogramMeter:
    """A real meter whose histograms cannot be made."""

    def __init__(self, meter: Any) -> None:
        self._meter = meter

    def __getattr__(self, name: str) -> Any:
        return getattr(self._meter, name)

    def create_histogram(self, *args: Any, **kwargs: Any) -> Any:
        raise ValueError("histograms are disabled")


class NoHistogramProvider:
    def __init__(self) -> None:
        self._real = MeterProvider(metric_readers=[InMemoryMetricReader()])

    def get_meter(self, *args: Any, **kwargs: Any) -> Any:
        return NoHistogramMeter(self._real.get_meter(*args, **kwargs))

    def __repr__(self) -> str:
        return "<NoHistogramProvider>"


@pytest.mark.parametrize(
    ("provider", "message"),
    [
        (
            BrokenProvider(),
            "AiocopInstrumentor.instrument(): meter_provider <BrokenProvider> could not make aiocop's instruments: "
            "RuntimeError: exporter endpoint refused the connection",
        ),
        (
            NoHistogramProvider(),
            "AiocopInstrumentor.instrument(): meter_provider <NoHistogramProvider> could not make aiocop's "
            "instruments: ValueError: histograms are disabled",
        ),
    ],
)
def test_a_provider_that_fails_at_instrument_is_named_and_nothing_starts(
    instrumentor: AiocopInstrumentor, provider: object, message: str
) -> None:
    before = (_state.started, _watchdog.watchdog.running, _callbacks.listening())
    with pytest.raises(RuntimeError) as raised:
        instrumentor.instrument(meter_provider=provider)
    assert str(raised.value) == message
    assert raised.value.__cause__ is not None  # the provider's own error, for its traceback
    assert (_state.started, _watchdog.watchdog.running, _callbacks.listening()) == before  # nothing started
    assert not _watchdog.watchdog.running
    assert not instrumentor.is_instrumented_by_opentelemetry


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"meter_provider": "otel"}, "meter_provider must be an OpenTelemetry provider (with get_meter()), not str"),
        ({"tracer_provider": 3}, "tracer_provider must be an OpenTelemetry provider (with get_tracer()), not int"),
    ],
)
def test_a_provider_of_the_wrong_kind_is_named(
    instrumentor: AiocopInstrumentor, options: dict[str, Any], message: str
) -> None:
    before = (_state.started, _watchdog.watchdog.running, _callbacks.listening())
    with pytest.raises(TypeError, match=message.replace("(", r"\(").replace(")", r"\)")):
        instrumentor.instrument(**options)
    assert (_state.started, _watchdog.watchdog.running, _callbacks.listening()) == before


class FailingHistogram:
    def record(self, *args: Any, **kwargs: Any) -> None:
        raise RuntimeError("SDK: aggregation failed")


class FailingRecordMeter(NoHistogramMeter):
    def create_histogram(self, *args: Any, **kwargs: Any) -> Any:
        return FailingHistogram()


class FailingRecordProvider(NoHistogramProvider):
    def get_meter(self, *args: Any, **kwargs: Any) -> Any:
        return FailingRecordMeter(self._real.get_meter(*args, **kwargs))


class FailingSpan(trace.NonRecordingSpan):
    """A span whose SDK fails to add events."""

    def is_recording(self) -> bool:
        return True

    def add_event(self, *args: Any, **kwargs: Any) -> None:
        raise RuntimeError("SDK: span processor failed")


def test_an_sdk_error_while_recording_never_reaches_the_application(
    instrumentor: AiocopInstrumentor, caplog: pytest.LogCaptureFixture
) -> None:
    instrumentor.instrument(meter_provider=FailingRecordProvider(), threshold_ms=20, probe_interval_ms=5)
    loop_errors: list[dict[str, Any]] = []

    async def main() -> str:
        asyncio.get_running_loop().set_exception_handler(lambda loop, context: loop_errors.append(context))
        with trace.use_span(FailingSpan(trace.INVALID_SPAN_CONTEXT)):
            for _ in range(3):
                os.stat(".")  # a span event each: add_event raises
                await asyncio.sleep(0.02)  # probe ticks: their histogram records raise
            stalls.spin(0.1)  # a stall: its histogram record and span event raise
            await asyncio.sleep(0.05)
        return "the application's result"

    with caplog.at_level(logging.ERROR, logger="aiocop"):
        assert asyncio.run(main()) == "the application's result"
        instrumentor.uninstrument()  # delivers what is pending
    assert loop_errors == []
    assert instrumentor.recording_errors >= 5  # 3 span events, a stall's histogram point and span event, ticks
    logged = [r for r in caplog.records if "OpenTelemetry raised" in r.getMessage()]
    assert len(logged) == 1, [r.getMessage() for r in caplog.records]
    assert "counted in AiocopInstrumentor().recording_errors" in logged[0].getMessage()


def test_recording_errors_are_counted(instrumentor: AiocopInstrumentor) -> None:
    # A threshold no step reaches: at 20 ms a step of asyncio.run's kept off
    # the CPU by a busy machine was a stall, and its refused record a third
    # error (load 8).
    instrumentor.instrument(meter_provider=FailingRecordProvider(), threshold_ms=1000, probe_interval_ms=0)

    async def main() -> None:
        with trace.use_span(FailingSpan(trace.INVALID_SPAN_CONTEXT)):
            os.stat(".")
            os.stat("..")
            await asyncio.sleep(0)

    asyncio.run(main())
    assert instrumentor.recording_errors == 2  # two span events refused; the application saw neither
