"""The GPU health agent: per node and per GPU, what the kernel log, the PCI bus, the driver's /proc
entries and NVML say about the GPUs, judged by NVIDIA's Xid catalogue, published for the operator
in the Node annotation nvidia.com/gpu-health.report and served as Prometheus metrics.

In the cluster it runs as `gpu-operator node health`, a container of the operator-validator
DaemonSet. In-process (the simulator plays it for fake nodes against their host trees):

    from gpu_operator.node.health import HealthAgent, encode

    agent = HealthAgent(HostFS(tree_root), "node-a", nvml=False)   # reads <root>/dev/kmsg from its end
    report = await agent.step()          # dict, or None while nothing changed (the first step: a dict)
    if report is not None:
        patch Node "node-a": metadata.annotations["nvidia.com/gpu-health.report"] = encode(report)
    ...
    final = agent.final()                # on stop: the last report with "stopped": true
    agent.close()

What it reads under the host root (what a simulator changes to play a fault):

- `/dev/kmsg`: a character device on a real host, a regular file of kmsg records in a tree;
  lines appended after the agent started (`3,1,0,-;NVRM: Xid (PCI:0000:41:00): 79, ...`) are
  judged; what it held at start is not.
- `/sys/bus/pci/devices/<bus>` with vendor 0x10de and class 0x0300xx/0x0302xx: a GPU there at
  start and gone later is `gone`.
- `/proc/driver/nvidia/gpus/<bus>/information`: a GPU the driver listed at start and no longer
  lists while the driver is loaded and the GPU still bound to nvidia is `unhealthy`.
- `/run/nvidia/validations/<component>-ready`: all present -> `validated`.

`evaluate(...)` (assess.py) is the pure function from observations to the report; the report's
format is described there and parsed by gpu_operator.api.health. `AnnotationPublisher` and `run`
(agent.py) are the in-cluster publisher and loop.
"""

from gpu_operator.node.health.agent import AnnotationPublisher, HealthAgent, HealthMetrics, run
from gpu_operator.node.health.assess import encode

__all__ = ["AnnotationPublisher", "HealthAgent", "HealthMetrics", "encode", "run"]
