{{/*
Names and labels shared by every template (the standard Helm helpers).
*/}}

{{/* The chart name, or nameOverride. */}}
{{- define "outbox-dispatcher.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* release-chart, shortened to the release name when it already contains the chart name. */}}
{{- define "outbox-dispatcher.fullname" -}}
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

{{/* chart-version, for the helm.sh/chart label. */}}
{{- define "outbox-dispatcher.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* The name of the operator's Deployment, ServiceAccount, Role and RoleBinding. */}}
{{- define "outbox-dispatcher.operatorName" -}}
{{- printf "%s-operator" (include "outbox-dispatcher.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* The name and instance labels. */}}
{{- define "outbox-dispatcher.selectorLabels" -}}
app.kubernetes.io/name: {{ include "outbox-dispatcher.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{/* The standard labels of every object of the chart. */}}
{{- define "outbox-dispatcher.labels" -}}
helm.sh/chart: {{ include "outbox-dispatcher.chart" . }}
{{ include "outbox-dispatcher.selectorLabels" . }}
app.kubernetes.io/part-of: outbox-dispatcher
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{/* The standard labels of the operator's objects. */}}
{{- define "outbox-dispatcher.operatorLabels" -}}
{{ include "outbox-dispatcher.labels" . }}
app.kubernetes.io/component: operator
{{- end }}

{{/* The selector of the operator pod (never changes across upgrades). */}}
{{- define "outbox-dispatcher.operatorSelectorLabels" -}}
{{ include "outbox-dispatcher.selectorLabels" . }}
app.kubernetes.io/component: operator
{{- end }}

{{/* The labels of the operator pod: no chart version, so a chart bump alone rolls nothing. */}}
{{- define "outbox-dispatcher.operatorPodLabels" -}}
{{ include "outbox-dispatcher.operatorSelectorLabels" . }}
app.kubernetes.io/part-of: outbox-dispatcher
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
{{- end }}

{{/* The operator's ServiceAccount name. */}}
{{- define "outbox-dispatcher.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "outbox-dispatcher.operatorName" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* The operator image: repository:tag, or repository@digest when a digest is given. */}}
{{- define "outbox-dispatcher.operatorImage" -}}
{{- include "outbox-dispatcher.image" (dict "image" .Values.operator.image "appVersion" .Chart.AppVersion) }}
{{- end }}

{{/* The console image (the enqueuer's: it carries the whole `dispatcher` command). */}}
{{- define "outbox-dispatcher.consoleImage" -}}
{{- include "outbox-dispatcher.image" (dict "image" .Values.console.image "appVersion" .Chart.AppVersion) }}
{{- end }}

{{/* The name of the console's Deployment and Service. */}}
{{- define "outbox-dispatcher.consoleName" -}}
{{- printf "%s-console" (include "outbox-dispatcher.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* The console's address inside the cluster (what the OutboxDispatcher's status names). */}}
{{- define "outbox-dispatcher.consoleUrl" -}}
{{- printf "http://%s.%s.svc:%v/" (include "outbox-dispatcher.consoleName" .) .Release.Namespace .Values.console.service.port }}
{{- end }}

{{/* The console's selector (never changes across upgrades). */}}
{{- define "outbox-dispatcher.consoleSelectorLabels" -}}
{{ include "outbox-dispatcher.selectorLabels" . }}
app.kubernetes.io/component: console
{{- end }}

{{/* An image from {image: {repository, tag, digest}, appVersion}: repository:tag or @digest. */}}
{{- define "outbox-dispatcher.image" -}}
{{- $image := .image }}
{{- if $image.digest }}
{{- printf "%s@%s" $image.repository $image.digest }}
{{- else }}
{{- $tag := default .appVersion $image.tag }}
{{- /* A number from --set or values.yaml arrives as a float: 1234567 must not become 1.234567e+06. */}}
{{- if kindIs "float64" $tag }}
{{- $tag = int64 $tag }}
{{- end }}
{{- printf "%s:%s" $image.repository (toString $tag) }}
{{- end }}
{{- end }}

{{/* The namespaces the operator watches (a Role and RoleBinding in each). */}}
{{- define "outbox-dispatcher.watchNamespaces" -}}
{{- if .Values.operator.watchNamespaces }}
{{- toJson (uniq .Values.operator.watchNamespaces) }}
{{- else }}
{{- toJson (list .Release.Namespace) }}
{{- end }}
{{- end }}

{{/* The fixed UID/GID of podSecurityContext, if any (none: each image's USER applies). */}}
{{- define "outbox-dispatcher.podIdentity" -}}
{{- with .Values.podSecurityContext }}
{{- if .runAsUser }}
runAsUser: {{ .runAsUser }}
{{- end }}
{{- if .runAsGroup }}
runAsGroup: {{ .runAsGroup }}
{{- end }}
{{- if .fsGroup }}
fsGroup: {{ .fsGroup }}
{{- end }}
{{- end }}
{{- end }}

{{/* The Role (and RoleBinding) of the operator's Lease, in the release namespace. */}}
{{- define "outbox-dispatcher.leaseRoleName" -}}
{{- printf "%s-lease" (include "outbox-dispatcher.operatorName" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* The rules of the operator's Role (or ClusterRole): see deploy/base/rbac.yaml. */}}
{{- define "outbox-dispatcher.operatorRules" -}}
- apiGroups: ["dispatch.composer.dev"]
  resources: ["outboxdispatchers"]
  verbs: ["get", "list", "watch", "patch"]
- apiGroups: ["dispatch.composer.dev"]
  resources: ["outboxdispatchers/status"]
  verbs: ["patch"]
- apiGroups: ["dispatch.composer.dev"]
  resources: ["outboxdispatchers/finalizers"]
  verbs: ["update"]
- apiGroups: ["apps"]
  resources: ["deployments"]
  verbs: ["get", "list", "watch", "create", "patch", "delete"]
- apiGroups: ["policy"]
  resources: ["poddisruptionbudgets"]
  verbs: ["get", "list", "watch", "create", "patch", "delete"]
- apiGroups: ["batch"]
  resources: ["jobs"]
  verbs: ["list", "watch", "create"]
- apiGroups: [""]
  resources: ["secrets"]
  {{- with .Values.rbac.secretNames }}
  resourceNames: {{ toJson (uniq .) }}
  {{- end }}
  verbs: ["get"]
- apiGroups: [""]
  resources: ["events"]
  verbs: ["create"]
- apiGroups: [""]
  resources: ["pods"]
  verbs: ["list"]
{{- end }}
