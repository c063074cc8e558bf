{{/* Chart name, truncated to the 63 characters a label value allows. */}}
{{- define "phalanx.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Full name: release-chart, or the release name alone when it already contains the chart name. */}}
{{- define "phalanx.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "phalanx.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Selector labels: stable for the life of a release (a Deployment's selector is immutable). */}}
{{- define "phalanx.selectorLabels" -}}
app.kubernetes.io/name: {{ include "phalanx.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: operator
{{- end }}

{{/* Labels on every object the chart renders. */}}
{{- define "phalanx.labels" -}}
helm.sh/chart: {{ include "phalanx.chart" . }}
{{ include "phalanx.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/part-of: phalanx
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{- define "phalanx.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "phalanx.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "phalanx.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}

{{/* Namespaces that get job-pod objects (NetworkPolicy): explicit list, else watched, else the release's. */}}
{{- define "phalanx.jobNamespaces" -}}
{{- $namespaces := .Values.networkPolicy.namespaces | default .Values.watchNamespaces | default (list .Release.Namespace) }}
{{- toJson $namespaces }}
{{- end }}

{{/* PromQL label matcher for the trainingjob phase used by alerts. */}}
{{- define "phalanx.runningPhaseMatcher" -}}
phase="{{ .Values.metrics.prometheusRule.thresholds.runningPhase }}"
{{- end }}
