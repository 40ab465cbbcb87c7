{{/*
The ClusterPolicy spec from the values: each component's values are its spec, key for key.
Only chart-only keys are dropped (ConfigMap `create`/`data`, nvidiaDriverCRD) and one key is
renamed (driver.upgradePolicy.gpuPodDeletion -> podDeletion), as in NVIDIA's chart.
Output: YAML mapping.
*/}}
{{- define "gpu-operator.clusterPolicySpec" -}}
{{- $root := . }}
{{- $v := .Values }}
{{- $configDrop := list "config.create" "config.data" }}
{{- $oneToOne := dict
    "toolkit" (list)
    "devicePlugin" $configDrop
    "dcgm" (list)
    "dcgmExporter" (append $configDrop "config.chartDefault")
    "gfd" (list)
    "migManager" $configDrop
    "gds" (list)
    "gdrcopy" (list)
    "vgpuManager" (list)
    "vgpuDeviceManager" (list)
    "vfioManager" (list)
    "sandboxDevicePlugin" (list)
    "kataSandboxDevicePlugin" (list)
    "ccManager" (list)
    "kataManager" (list)
    "mig" (list)
    "psa" (list)
    "cdi" (list)
    "sandboxWorkloads" (list)
    "hostPaths" (list) }}
{{- $spec := dict }}
{{- range $key, $drop := $oneToOne }}
{{- $_ := set $spec $key (include "gpu-operator.specOf" (dict "values" (index $v $key) "drop" $drop) | fromYaml) }}
{{- end }}

{{- /* dcgmExporter.config naming no ConfigMap: the chart's metrics file (configmaps.yaml) */}}
{{- if include "gpu-operator.dcgmChartMetrics" $root }}
{{- $_ := set $spec.dcgmExporter "config" (dict "name" (include "gpu-operator.dcgmChartMetrics" $root)) }}
{{- end }}

{{- /* operator: only the keys that are ClusterPolicy fields; the rest runs the Deployment */}}
{{- $_ := set $spec "operator" (pick $v.operator "runtimeClass" "defaultRuntime" "initContainer" "use_ocp_driver_toolkit" "metrics") }}

{{- $daemonsets := omit $v.daemonsets "rollingUpdate" }}
{{- /* empty daemonsets.labels/annotations left out: Helm 4 (server-side apply) adopting a ClusterPolicy
     whose labels its earlier apply set (NVIDIA's release, docs/migrate.md step 2) would write them null,
     which the CRD refuses (tests/integration/test_migrate_helm.py) */}}
{{- range $k := list "labels" "annotations" }}{{- if not (index $daemonsets $k) }}{{- $_ := unset $daemonsets $k }}{{- end }}{{- end }}
{{- if eq ($v.daemonsets.updateStrategy | default "RollingUpdate") "RollingUpdate" }}
{{- $_ := set $daemonsets "rollingUpdate" ($v.daemonsets.rollingUpdate | default dict) }}
{{- end }}
{{- $_ := set $spec "daemonsets" $daemonsets }}

{{- $driverDrop := list "nvidiaDriverCRD" "upgradePolicy.gpuPodDeletion" }}
{{- if $v.driver.nvidiaDriverCRD.enabled }}
{{- /* NVIDIADriver objects then own the driver image */}}
{{- $driverDrop = concat $driverDrop (list "repository" "image" "version") }}
{{- end }}
{{- $driver := include "gpu-operator.specOf" (dict "values" $v.driver "drop" $driverDrop) | fromYaml }}
{{- $_ := set $driver "useNvidiaDriverCRD" ($v.driver.nvidiaDriverCRD.enabled | default false) }}
{{- with $v.driver.upgradePolicy }}
{{- if hasKey . "gpuPodDeletion" }}
{{- $_ := set $driver.upgradePolicy "podDeletion" .gpuPodDeletion }}
{{- end }}
{{- end }}
{{- $_ := set $spec "driver" $driver }}

{{- range $key := list "validator" "nodeStatusExporter" }}
{{- $component := include "gpu-operator.specOf" (dict "values" (index $v $key) "drop" (list)) | fromYaml }}
{{- $component = merge (include "gpu-operator.ownImageFields" (dict "root" $root "spec" $component) | fromYaml) $component }}
{{- $_ := set $spec $key $component }}
{{- end }}
{{- toYaml $spec }}
{{- end }}

{{/*
Paths of the ClusterPolicy spec that its CRD does not define, which the API server would
silently prune. Walks the rendered spec against the schema in crds/ (generated from the
operator's API models). Input: dict "value" "schema" "path" "acc" (acc.found collects).
*/}}
{{- define "gpu-operator.prunedPaths" -}}
{{- $schema := .schema | default dict -}}
{{- if not (index $schema "x-kubernetes-preserve-unknown-fields") -}}
{{- if kindIs "map" .value -}}
{{- $properties := $schema.properties | default dict -}}
{{- $additional := $schema.additionalProperties -}}
{{- range $key, $child := .value -}}
{{- $path := printf "%s.%s" $.path $key -}}
{{- if hasKey $properties $key -}}
{{- include "gpu-operator.prunedPaths" (dict "value" $child "schema" (index $properties $key) "path" $path "acc" $.acc) -}}
{{- else if kindIs "map" $additional -}}
{{- include "gpu-operator.prunedPaths" (dict "value" $child "schema" $additional "path" $path "acc" $.acc) -}}
{{- else if not $additional -}}
{{- $_ := set $.acc "found" (append $.acc.found $path) -}}
{{- end -}}
{{- end -}}
{{- else if and (kindIs "slice" .value) $schema.items -}}
{{- range $index, $item := .value -}}
{{- include "gpu-operator.prunedPaths" (dict "value" $item "schema" $schema.items "path" (printf "%s[%d]" $.path $index) "acc" $.acc) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end }}

{{/* The pruned spec paths of this release's ClusterPolicy as a YAML list (empty without the CRD). */}}
{{- define "gpu-operator.clusterPolicyPruned" -}}
{{- $acc := dict "found" (list) -}}
{{- $crd := .Files.Get "crds/nvidia.com_clusterpolicies.yaml" | fromYaml -}}
{{- if and $crd .Values.clusterPolicy.deployCR -}}
{{- $schema := (first $crd.spec.versions).schema.openAPIV3Schema.properties.spec -}}
{{- $spec := include "gpu-operator.clusterPolicySpec" . | fromYaml -}}
{{- include "gpu-operator.prunedPaths" (dict "value" $spec "schema" $schema "path" "spec" "acc" $acc) -}}
{{- end -}}
{{- toYaml $acc.found -}}
{{- end }}
