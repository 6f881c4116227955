"""Inject EC2 errors into a real boto3 client (talking to moto) through botocore's own event hooks.

The same mechanism as botocore's Stubber (a ``before-call`` handler that answers instead of the
service), but selective: only calls matching a rule fail, everything else reaches moto. Used to make
one zone or instance type run out of capacity while the rest of the cloud keeps working.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from botocore.awsrequest import AWSResponse

Params = dict[str, Any]


@dataclasses.dataclass
class Rule:
    operation: str
    code: str
    when: Callable[[Params], bool]
    times: int | None
    status: int = 400


class Faults:
    def __init__(self) -> None:
        self.rules: list[Rule] = []
        self.injected: list[tuple[str, str]] = []

    def fail(self, operation: str, code: str, *, when: Callable[[Params], bool] = lambda p: True,
             times: int | None = None, status: int = 400) -> None:
        self.rules.append(Rule(operation, code, when, times, status))

    def attach(self, client: Any) -> Any:
        client.meta.events.register("provide-client-params.ec2.*", self._remember)
        client.meta.events.register("before-call.ec2.*", self._answer)
        return client

    @staticmethod
    def _remember(params: Params, context: dict[str, Any], **_: Any) -> None:
        context["faults_params"] = dict(params)

    def _answer(self, model: Any, context: dict[str, Any], **_: Any) -> tuple[AWSResponse, Params] | None:
        params = context.get("faults_params", {})
        for rule in self.rules:
            if rule.operation == model.name and rule.when(params) and rule.times != 0:
                if rule.times is not None:
                    rule.times -= 1
                self.injected.append((model.name, rule.code))
                parsed = {"Error": {"Code": rule.code, "Message": f"injected {rule.code}"},
                          "ResponseMetadata": {"HTTPStatusCode": rule.status}}
                return AWSResponse(None, rule.status, {}, None), parsed
        return None


def in_zone(zone: str) -> Callable[[Params], bool]:
    return lambda p: p.get("Placement", {}).get("AvailabilityZone") == zone


def of_type(instance_type: str) -> Callable[[Params], bool]:
    return lambda p: p.get("InstanceType") == instance_type
