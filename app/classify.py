"""Turn an admitted API call into a classified Request with its SLO and pool."""

from __future__ import annotations

from collections.abc import Mapping

from core.classes import LengthClassConfig, ServiceClass
from core.request import Request


class UnknownServiceClass(ValueError):
    pass


class Classifier:
    """Length class from prompt and predicted output; service class from key or header."""

    def __init__(
        self,
        lengths: LengthClassConfig,
        services: Mapping[str, ServiceClass],
        pool_of_class: Mapping[str, str],
    ) -> None:
        missing = set(LengthClassConfig.names()) - set(pool_of_class)
        if missing:
            raise ValueError(f"length classes without a pool: {sorted(missing)}")
        self.lengths = lengths
        self.services = dict(services)
        self.pool_of_class = dict(pool_of_class)

    def classify(
        self,
        request_id: str,
        prompt_tokens: int,
        max_tokens: int,
        predicted_output_tokens: int,
        service_class: str,
        arrival_s: float,
        tenant: str = "default",
        target_output_tokens: int | None = None,
        slo_override: Mapping[str, float] | None = None,
    ) -> tuple[Request, str]:
        """Return the request and the name of the pool that should serve it. A tenant's own
        targets (`slo_override`: ttft_s / tbt_s from its API key) are final."""
        service = self.services.get(service_class)
        if service is None:
            raise UnknownServiceClass(
                f"unknown service class {service_class!r}; expected one of {sorted(self.services)}"
            )
        length_class = self.lengths.classify(prompt_tokens, predicted_output_tokens)
        slo = service.slo
        if service.tighten_with_length_class:
            slo = slo.tightest(self.lengths.slo(length_class))
        if slo_override:
            slo = slo.model_copy(update=dict(slo_override))
        request = Request(
            request_id=request_id, prompt_tokens=prompt_tokens, max_tokens=max_tokens,
            arrival_s=arrival_s, slo=slo, service_class=service_class, length_class=length_class,
            predicted_output_tokens=predicted_output_tokens, target_output_tokens=target_output_tokens,
            tenant=tenant,
        )
        return request, self.pool_of_class[length_class]
