"""The 20 ClusterPolicy states in upstream's order; each module defines one `OPERAND`."""

from __future__ import annotations

from gpu_operator.render.operand import Operand
from gpu_operator.render.states import (
    cc_manager,
    container_toolkit,
    dcgm,
    dcgm_exporter,
    device_plugin,
    driver,
    gpu_feature_discovery,
    kata_device_plugin,
    kata_manager,
    mig_manager,
    mps_control_daemon,
    node_status_exporter,
    operator_metrics,
    operator_validation,
    prerequisites,
    sandbox_device_plugin,
    sandbox_validation,
    vfio_manager,
    vgpu_device_manager,
    vgpu_manager,
)

ORDER: tuple[Operand, ...] = (
    prerequisites.OPERAND,
    operator_metrics.OPERAND,
    driver.OPERAND,
    container_toolkit.OPERAND,
    operator_validation.OPERAND,
    device_plugin.OPERAND,
    mps_control_daemon.OPERAND,
    dcgm.OPERAND,
    dcgm_exporter.OPERAND,
    gpu_feature_discovery.OPERAND,
    mig_manager.OPERAND,
    node_status_exporter.OPERAND,
    vgpu_manager.OPERAND,
    vgpu_device_manager.OPERAND,
    sandbox_validation.OPERAND,
    vfio_manager.OPERAND,
    sandbox_device_plugin.OPERAND,
    kata_device_plugin.OPERAND,
    kata_manager.OPERAND,
    cc_manager.OPERAND,
)
