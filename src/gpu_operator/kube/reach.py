"""How a command reaches a cluster. Every command that talks to one (`status`, `upgrade`,
`cleanup`, `must-gather`, `crds apply`) gets its client here: `run_kube` (a `Kube`, for the
admin commands) or `sync_client` (a lightkube Client, for `status` and `crds apply`), both from
`load_target`. A kubeconfig that cannot be loaded, an apiserver that cannot be reached and a
request it refused are one line on stderr and exit 2, never a traceback. The line names the
apiserver and the configuration it came from, and what to check."""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

import httpx2
import typer
import yaml
from lightkube import ConfigError
from lightkube.config.kubeconfig import SingleConfig
from lightkube.core.exceptions import ApiError

if TYPE_CHECKING:
    from gpu_operator.kube.client import Kube

T = TypeVar("T")
EXIT_CODE = 2
CHECK = (
    "check that the apiserver is up and reachable from here, and that this is the cluster you mean "
    "(--kubeconfig or KUBECONFIG)"
)


class Unreachable(RuntimeError):
    """No answer from the apiserver where the caller does not raise the client's own error
    (must-gather reads through answers that never raise); the message says why."""


@dataclass(frozen=True)
class Target:
    """The apiserver a command talks to and the configuration that named it."""

    config: SingleConfig

    @property
    def server(self) -> str:
        return str(self.config.cluster.server)

    @property
    def where(self) -> str:
        """`https://10.0.0.1:6443 (kubeconfig /root/.kube/config, context admin)`."""
        if self.config.fname is None:
            return f"{self.server} (the pod's in-cluster service account)"
        return f"{self.server} (kubeconfig {self.config.fname}, context {self.config.context_name})"


def load_target(kubeconfig: str | None) -> Target:
    """The kubeconfig (`--kubeconfig`/KUBECONFIG, else in-cluster, else ~/.kube/config), or
    typer.BadParameter saying which file and why."""
    from gpu_operator.kube.client import load_config

    source = kubeconfig or "in-cluster service account, else ~/.kube/config"
    try:
        single = load_config(kubeconfig).get()
    except (ConfigError, OSError, yaml.YAMLError) as err:
        raise typer.BadParameter(
            f"cannot load a kubeconfig ({source}): {' '.join(str(err).split())}; "
            "pass --kubeconfig or set KUBECONFIG",
            param_hint="--kubeconfig",
        ) from err
    if single is None or single.user is None:
        raise typer.BadParameter(
            f"the kubeconfig ({source}) has no current context with a user: set one "
            "(kubectl config use-context NAME)",
            param_hint="--kubeconfig",
        )
    return Target(single)


def _find(err: BaseException, kind: type[BaseException]) -> BaseException | None:
    """`err` itself, an exception it was raised from (`raise ... from`), or one inside an
    exception group, that is a `kind`."""
    seen: set[int] = set()
    todo: list[BaseException] = [err]
    while todo:
        current = todo.pop()
        if id(current) in seen:
            continue
        seen.add(id(current))
        if isinstance(current, kind):
            return current
        if isinstance(current, BaseExceptionGroup):
            todo.extend(current.exceptions)
        if current.__cause__ is not None:
            todo.append(current.__cause__)
    return None


def unreachable_line(target: Target, doing: str, why: str) -> str:
    return f"error: cannot reach the Kubernetes API at {target.where} to {doing}: {why}; {CHECK}"


def refused_line(target: Target, doing: str, err: ApiError, needs: str = "") -> str:
    request = f"{err.request.method} {err.request.url.path}" if _has_request(err) else "a request"
    status = " ".join(str(part) for part in (err.status.code, err.status.reason) if part)
    hint = f"; {needs}" if needs else ""
    return (
        f"error: the Kubernetes API at {target.server} refused {request} (to {doing}): "
        f"{status}: {err.status.message or 'no message'}{hint}"
    )


def _has_request(err: httpx2.HTTPStatusError) -> bool:
    try:
        return err.request is not None
    except RuntimeError:  # httpx raises when no request was attached
        return False


def _say(line: str) -> None:
    typer.secho(line, fg="red", err=True)


@contextlib.contextmanager
def api_errors(target: Target, doing: str, needs: str = "") -> Iterator[None]:
    """Around a command's work: an apiserver not reached (any transport error, also raised from
    an exception group or as `Unreachable`) or a request it refused (ApiError) becomes one line
    on stderr and exit 2. `doing` completes "to ..." ("list the ClusterPolicies"); `needs` is
    added to a refusal (the permissions the command needs). Anything else passes through."""
    try:
        yield
    except Exception as err:
        transport = _find(err, httpx2.TransportError) or _find(err, Unreachable)
        if transport is not None:
            why = (
                str(transport)
                if isinstance(transport, Unreachable)
                else f"{type(transport).__name__}: {transport}"
            )
            _say(unreachable_line(target, doing, why))
            raise typer.Exit(EXIT_CODE) from err
        refused = _find(err, ApiError)
        if isinstance(refused, ApiError):
            _say(refused_line(target, doing, refused, needs))
            raise typer.Exit(EXIT_CODE) from err
        raise


@contextlib.contextmanager
def sync_client(kubeconfig: str | None, doing: str, needs: str = "") -> Iterator[Any]:
    """A lightkube Client for `kubeconfig`, its failures reported as `api_errors` does."""
    from lightkube import Client

    target = load_target(kubeconfig)
    with api_errors(target, doing, needs):
        client = Client(target.config)
        try:
            yield client
        finally:
            client.close()


def run_kube(
    target: Target | str | None, doing: str, work: Callable[[Kube], Awaitable[T]], needs: str = ""
) -> T:
    """Run `work` with a `Kube` for `target` (a Target, or a kubeconfig path: None for
    KUBECONFIG, in-cluster, ~/.kube/config) to its end, and close the Kube; its failures are
    reported as `api_errors` does. What `work` raises besides passes through."""
    import asyncio

    from gpu_operator.kube.client import Kube

    where = target if isinstance(target, Target) else load_target(target)

    async def go() -> T:
        kube = Kube(config=where.config)
        try:
            return await work(kube)
        finally:
            await kube.close()

    with api_errors(where, doing, needs):
        return asyncio.run(go())


async def node_or_exit(kube: Kube, node: str) -> dict[str, Any]:
    """The Node a command names, else one line on stderr (as kubectl says it) and exit 2."""
    body = await kube.get_dict("v1", "Node", node)
    if body is None:
        typer.echo(f'Node {node}: nodes "{node}" not found', err=True)
        raise typer.Exit(EXIT_CODE)
    return body
