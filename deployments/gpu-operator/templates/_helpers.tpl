{{/* Names, labels and image references shared by the templates. */}}

{{- define "gpu-operator.labels" -}}
app.kubernetes.io/name: gpu-operator
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end }}

{{/*
Our custom resources (group nvidia.com) by plural: the one list every rule of the chart that
names them reads (rbac.yaml, cleanup-hook.yaml, crds-hook.yaml), read from the chart's generated
CRD files (crds/nvidia.com_<plural>.yaml, `gpu-operator crds generate`), so a new kind of ours
needs no edit here. The operator's rows are src/gpu_operator/controllers/customresources.py;
tests/unit/chart/test_chart_permissions.py and test_watched_kinds.py hold the chart's grants to them.
Input: dict "root" $ "suffix" ("", "/status", "/finalizers", ".nvidia.com": the CRDs' names).
Output: a JSON list.
*/}}
{{- define "gpu-operator.customResources" -}}
{{- $suffix := .suffix -}}
{{- $names := list -}}
{{- range $path, $_ := .root.Files.Glob "crds/nvidia.com_*.yaml" -}}
{{- $names = append $names (printf "%s%s" ($path | trimPrefix "crds/nvidia.com_" | trimSuffix ".yaml") $suffix) -}}
{{- end -}}
{{- toJson $names -}}
{{- end }}

{{/* The upstream defaults that name NVIDIA's Go operator image, which cannot run `gpu-operator run`. */}}
{{- define "gpu-operator.isUpstreamOperatorImage" -}}
{{- if and (eq (.repository | default "") "nvcr.io/nvidia") (eq (.image | default "") "gpu-operator") -}}true{{- end -}}
{{- end }}

{{/*
The image fields (repository, image, version) of a component that runs from our operator
image (operator, validator, node-status-exporter). NVIDIA's default pair is replaced by ours,
version included (and reported by gpu-operator.unsupported); an unset version means the
appVersion.
Input: dict "root" $ "spec" <component values>. Output: YAML mapping.
*/}}
{{- define "gpu-operator.ownImageFields" -}}
{{- $spec := .spec -}}
{{- $own := .root.Values.operator -}}
{{- $repository := $spec.repository -}}
{{- $image := $spec.image -}}
{{- $version := $spec.version | default .root.Chart.AppVersion -}}
{{- if include "gpu-operator.isUpstreamOperatorImage" $spec -}}
{{- /* a version pinned for NVIDIA's image names no image of ours */ -}}
{{- $repository = "ghcr.io/gpu-operator-py" -}}
{{- $image = "gpu-operator" -}}
{{- $version = .root.Chart.AppVersion -}}
{{- if not (include "gpu-operator.isUpstreamOperatorImage" $own) -}}
{{- $repository = $own.repository -}}
{{- $image = $own.image -}}
{{- $version = $own.version | default .root.Chart.AppVersion -}}
{{- end -}}
{{- end -}}
repository: {{ $repository | quote }}
image: {{ $image | quote }}
version: {{ $version | toString | quote }}
{{- end }}

{{/*
A full image reference from repository, image and version, by upstream's rule: image alone
when repository and version are empty; `@version` for sha256 digests. Empty when incomplete.
*/}}
{{- define "gpu-operator.imageRef" -}}
{{- $repository := .repository | default "" -}}
{{- $image := .image | default "" -}}
{{- $version := .version | default "" | toString -}}
{{- if and $image (not $repository) (not $version) -}}
{{ $image }}
{{- else if and $repository $image $version -}}
{{- if hasPrefix "sha256:" $version -}}
{{ printf "%s/%s@%s" $repository $image $version }}
{{- else -}}
{{ printf "%s/%s:%s" $repository $image $version }}
{{- end -}}
{{- end -}}
{{- end }}

{{- define "gpu-operator.operatorImage" -}}
{{- include "gpu-operator.imageRef" (include "gpu-operator.ownImageFields" (dict "root" . "spec" .Values.operator) | fromYaml) -}}
{{- end }}

{{/*
A component's values as its ClusterPolicy spec: a deep copy without the chart-only keys.
Input: dict "values" <map> "drop" <list of keys, "a" or "a.b">. Output: YAML mapping.
*/}}
{{- define "gpu-operator.specOf" -}}
{{- $spec := deepCopy (.values | default dict) -}}
{{- /* hostNetwork: false is the default; left out of the policy, as NVIDIA's chart does */ -}}
{{- if and (hasKey $spec "hostNetwork") (not $spec.hostNetwork) -}}
{{- $_ := unset $spec "hostNetwork" -}}
{{- end -}}
{{- range .drop -}}
{{- $path := splitList "." . -}}
{{- if eq (len $path) 1 -}}
{{- $_ := unset $spec (first $path) -}}
{{- else if kindIs "map" (index $spec (first $path) | default "") -}}
{{- $_ := unset (index $spec (first $path)) (last $path) -}}
{{- end -}}
{{- end -}}
{{- toYaml $spec -}}
{{- end }}

{{/*
The pod securityContext of the operator and of the hook Jobs that run its image:
operator.securityContext (NVIDIA's key, gpu-operator #2843), left out when the values make it empty.
*/}}
{{- define "gpu-operator.podSecurityContext" -}}
{{- with .Values.operator.securityContext -}}
securityContext:
  {{- toYaml . | nindent 2 }}
{{- end -}}
{{- end }}

{{/*
The name of the chart's own DCGM exporter metrics ConfigMap (files/dcgm-metrics.csv) when the
exporter uses it: dcgmExporter.config names no ConfigMap and config.chartDefault is on; else empty.
*/}}
{{- define "gpu-operator.dcgmChartMetrics" -}}
{{- $config := .Values.dcgmExporter.config | default dict -}}
{{- if and (not $config.name) (ne (toString $config.chartDefault) "false") -}}
gpu-operator-dcgm-metrics
{{- end -}}
{{- end }}
