{{/* Chart name, truncated to the 63 characters a label value allows. */}}
{{- define "gpushare-operator.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
Fully qualified app name: <release>-<chart>, or the release name alone when it already
contains the chart name.  Cluster-scoped objects (ClusterRole, ClusterRoleBinding) carry it, so
two releases never collide.
*/}}
{{- define "gpushare-operator.fullname" -}}
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

{{- define "gpushare-operator.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Labels on every object; app.kubernetes.io/instance finds all of a release's objects. */}}
{{- define "gpushare-operator.labels" -}}
helm.sh/chart: {{ include "gpushare-operator.chart" . }}
{{ include "gpushare-operator.selectorLabels" . }}
app.kubernetes.io/version: {{ .Values.image.tag | default .Chart.AppVersion | trunc 63 | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: gpushare
{{- end }}

{{- define "gpushare-operator.selectorLabels" -}}
app.kubernetes.io/name: {{ include "gpushare-operator.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "gpushare-operator.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "gpushare-operator.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* --namespace: the Lease and leadership Events; the release namespace unless set. */}}
{{- define "gpushare-operator.operatorNamespace" -}}
{{- default .Release.Namespace .Values.operator.namespace }}
{{- end }}

{{- define "gpushare-operator.image" -}}
{{- if .Values.image.digest }}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository (.Values.image.tag | default .Chart.AppVersion | toString) }}
{{- end }}
{{- end }}

{{/* As set; else IfNotPresent for an image by digest (it cannot change), Always for a tag. */}}
{{- define "gpushare-operator.imagePullPolicy" -}}
{{- if .Values.image.pullPolicy }}
{{- .Values.image.pullPolicy }}
{{- else if .Values.image.digest }}IfNotPresent
{{- else }}Always
{{- end }}
{{- end }}

{{/* Where kubernetes_asyncio's in-cluster config and kopf read the token, CA and namespace. */}}
{{- define "gpushare-operator.serviceAccountDir" -}}
/var/run/secrets/kubernetes.io/serviceaccount
{{- end }}

{{/*
Flag values as the container sees them: numbers without a float's exponent or trailing ".0"
noise, as strings (environment variables are strings).
*/}}
{{- define "gpushare-operator.number" -}}
{{- $value := . }}
{{- if kindIs "float64" $value }}
{{- if eq (float64 (int64 $value)) $value }}
{{- int64 $value | toString }}
{{- else }}
{{- $value | toString }}
{{- end }}
{{- else }}
{{- $value | toString }}
{{- end }}
{{- end }}

{{/* The timings must be ordered as the operator requires, or it would refuse to start. */}}
{{- define "gpushare-operator.validate" -}}
{{- $o := .Values.operator }}
{{- if eq (int $o.metricsPort) (int $o.httpPort) }}
{{- fail (printf "operator: metricsPort and httpPort must differ (both %v): they are two servers" $o.httpPort) }}
{{- end }}
{{- if ne (empty (include "gpushare-operator.metricsCertFile" .)) (empty (include "gpushare-operator.metricsKeyFile" .)) }}
{{- fail "operator: set both metricsCertFile and metricsKeyFile, or neither" }}
{{- end }}
{{- if not (and (lt (float64 $o.retryPeriod) (float64 $o.renewDeadline)) (lt (float64 $o.renewDeadline) (float64 $o.leaseDuration))) }}
{{- fail (printf "operator: need retryPeriod (%v) < renewDeadline (%v) < leaseDuration (%v)" $o.retryPeriod $o.renewDeadline $o.leaseDuration) }}
{{- end }}
{{- $w := .Values.webhook }}
{{- if $w.enabled }}
{{- if or (eq (int $w.port) (int $o.httpPort)) (eq (int $w.port) (int $o.metricsPort)) }}
{{- fail (printf "webhook: port (%v) must differ from operator.httpPort and operator.metricsPort: they are three servers" $w.port) }}
{{- end }}
{{- if lt (float64 $w.certValidity) 30.0 }}
{{- fail (printf "webhook: certValidity (%v) must be at least 30 seconds" $w.certValidity) }}
{{- end }}
{{- end }}
{{- $pdb := .Values.podDisruptionBudget }}
{{- if and $pdb.enabled (not $pdb.maxUnavailable) (not (kindIs "string" $pdb.minAvailable)) }}
{{- if ge (int $pdb.minAvailable) (int .Values.replicaCount) }}
{{- fail (printf "podDisruptionBudget.minAvailable (%v) must be below replicaCount (%v), or the budget blocks every node drain" $pdb.minAvailable .Values.replicaCount) }}
{{- end }}
{{- end }}
{{- end }}

{{- define "gpushare-operator.metricsTlsDir" -}}
/etc/gpushare/metrics-tls
{{- end }}

{{/* --metrics-cert-file / --metrics-key-file: as set, else metricsCertSecret's files. */}}
{{- define "gpushare-operator.metricsCertFile" -}}
{{- if .Values.operator.metricsCertFile }}
{{- .Values.operator.metricsCertFile }}
{{- else if .Values.metricsCertSecret }}
{{- include "gpushare-operator.metricsTlsDir" . }}/tls.crt
{{- end }}
{{- end }}

{{- define "gpushare-operator.metricsKeyFile" -}}
{{- if .Values.operator.metricsKeyFile }}
{{- .Values.operator.metricsKeyFile }}
{{- else if .Values.metricsCertSecret }}
{{- include "gpushare-operator.metricsTlsDir" . }}/tls.key
{{- end }}
{{- end }}

{{/*
"true" when the Role in the device-plugin namespace can be created: the namespace exists, or
Helm cannot tell (`helm template`, a client-side dry run: every lookup comes back empty, even
of kube-system, which every cluster has), in which case it is rendered as if it existed.
*/}}
{{- define "gpushare-operator.devicePluginNamespaceReady" -}}
{{- if not (lookup "v1" "Namespace" "" "kube-system") }}true
{{- else if lookup "v1" "Namespace" "" .Values.devicePlugin.namespace }}true
{{- end }}
{{- end }}

{{/* The metrics Service port's name says its scheme (Prometheus and Istio read it so). */}}
{{- define "gpushare-operator.metricsPortName" -}}
{{- if .Values.operator.metricsInsecure }}http-metrics{{ else }}https-metrics{{ end }}
{{- end }}

{{/*
The memory-request webhook's names (--webhook-service, --webhook-configuration,
--webhook-secret): as set, else the release's full name with a suffix, like the chart's other
objects. The configuration is cluster-scoped: two releases must not share one.
*/}}
{{- define "gpushare-operator.webhookServiceName" -}}
{{- default (printf "%s-webhook" (include "gpushare-operator.fullname" .)) .Values.webhook.serviceName }}
{{- end }}

{{- define "gpushare-operator.webhookConfigurationName" -}}
{{- default (include "gpushare-operator.fullname" .) .Values.webhook.configurationName }}
{{- end }}

{{- define "gpushare-operator.webhookSecretName" -}}
{{- default (printf "%s-webhook-tls" (include "gpushare-operator.fullname" .)) .Values.webhook.secretName }}
{{- end }}

{{/*
--webhook-hosts: webhook.hosts, comma-separated. The operator puts the Service's DNS names in
its certificate as <service>.<--namespace>.svc; the Service is in the release namespace (with
the pods it selects), so when operator.namespace names another one, the Service's real names
are added here, or the API server would refuse the certificate.
*/}}
{{- define "gpushare-operator.webhookHosts" -}}
{{- $hosts := list }}
{{- range .Values.webhook.hosts }}
{{- $hosts = append $hosts . }}
{{- end }}
{{- if ne (include "gpushare-operator.operatorNamespace" .) .Release.Namespace }}
{{- $service := printf "%s.%s.svc" (include "gpushare-operator.webhookServiceName" .) .Release.Namespace }}
{{- $hosts = append $hosts $service }}
{{- $hosts = append $hosts (printf "%s.cluster.local" $service) }}
{{- end }}
{{- join "," $hosts }}
{{- end }}
