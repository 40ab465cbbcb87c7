{{/*
Values this chart accepts for compatibility with NVIDIA's chart but does not act on yet, as a
YAML list of {key, value, effect}. Shown in NOTES and kept in the ConfigMap
gpu-operator-values-report, so nothing a user set is dropped without a word.
*/}}
{{- define "gpu-operator.unsupported" -}}
{{- $v := .Values -}}
{{- $found := list -}}
{{- $checks := list
    (list "nfd.nodefeaturerules" $v.nfd.nodefeaturerules "the NodeFeatureRule for gdrcopy/GDS/peermem capability labels is not rendered")
    (list "kataManager.enabled" $v.kataManager.enabled "kata-manager is deprecated and ignored by the operator")
    (list "platform.openshift" $v.platform.openshift "OpenShift specifics (SCCs, driver toolkit) are not rendered by the operator yet; only the RBAC rules are granted") -}}
{{- range $checks -}}
{{- if index . 1 -}}
{{- $found = append $found (dict "key" (index . 0) "value" (index . 1) "effect" (index . 2)) -}}
{{- end -}}
{{- end -}}
{{- range include "gpu-operator.clusterPolicyPruned" . | fromYamlArray -}}
{{- $found = append $found (dict "key" . "value" "(set)" "effect" "not a field of the ClusterPolicy CRD; the API server drops it") -}}
{{- end -}}
{{- with (index $v "node-feature-discovery") -}}
{{- $found = append $found (dict "key" "node-feature-discovery" "value" "(set)" "effect" "NFD is not shipped with this chart (nfd.enabled runs its own NFD-compatible GPU discovery); the subchart's values are ignored") -}}
{{- end -}}
{{- with $v.psp -}}
{{- $found = append $found (dict "key" "psp" "value" . "effect" "PodSecurityPolicy support is deprecated upstream and ignored") -}}
{{- end -}}
{{- with $v.operator.defaultGPUMode -}}
{{- $found = append $found (dict "key" "operator.defaultGPUMode" "value" . "effect" "not a ClusterPolicy field (NVIDIA's chart renders it and the API server prunes it); ignored") -}}
{{- end -}}
{{- $logging := $v.operator.logging | default dict -}}
{{- /* logging.level is the operator's --log-level; these two have no equivalent here */ -}}
{{- $loggingDefaults := dict "timeEncoding" "epoch" "develMode" false -}}
{{- range $key, $default := $loggingDefaults -}}
{{- if and (hasKey $logging $key) (ne (toString (index $logging $key)) (toString $default)) -}}
{{- $found = append $found (dict "key" (printf "operator.logging.%s" $key) "value" (index $logging $key) "effect" "the operator's log settings are not configurable from the chart yet; ignored") -}}
{{- end -}}
{{- end -}}
{{- range $key := list "operator" "validator" "nodeStatusExporter" -}}
{{- if include "gpu-operator.isUpstreamOperatorImage" (index $v $key) -}}
{{- $found = append $found (dict "key" (printf "%s.repository/%s.image" $key $key) "value" "nvcr.io/nvidia/gpu-operator" "effect" "NVIDIA's Go operator image cannot run this operator; replaced by this chart's operator image (its version too). Remove these keys from your values to silence this") -}}
{{- end -}}
{{- end -}}
{{- $known := list "global" "platform" "nfd" "psa" "cdi" "sandboxWorkloads" "hostPaths" "daemonsets" "validator" "operator" "mig" "driver" "toolkit" "devicePlugin" "dcgm" "dcgmExporter" "gfd" "migManager" "nodeStatusExporter" "gds" "gdrcopy" "vgpuManager" "vgpuDeviceManager" "vfioManager" "kataManager" "sandboxDevicePlugin" "kataSandboxDevicePlugin" "ccManager" "clusterPolicy" "gpuCluster" "draDriver" "extraObjects" "psp" "node-feature-discovery" "monitoring" -}}
{{- $operatorKeys := list "repository" "image" "version" "imagePullPolicy" "imagePullSecrets" "env" "priorityClassName" "runtimeClass" "use_ocp_driver_toolkit" "cleanupCRD" "upgradeCRD" "cleanupOnUninstall" "nodeSelector" "tolerations" "affinity" "annotations" "labels" "logging" "resources" "replicas" "defaultGPUMode" "metrics" "securityContext" "dnsPolicy" "dnsConfig" -}}
{{- range $key, $value := ($v.operator | default dict) -}}
{{- if not (has $key $operatorKeys) -}}
{{- $found = append $found (dict "key" (printf "operator.%s" $key) "value" $value "effect" "not a key of this chart's operator section; ignored") -}}
{{- end -}}
{{- end -}}
{{- range $key, $value := $v -}}
{{- if not (has $key $known) -}}
{{- $found = append $found (dict "key" $key "value" $value "effect" "not a key of this chart; ignored") -}}
{{- end -}}
{{- end -}}
{{- toYaml $found -}}
{{- end }}
