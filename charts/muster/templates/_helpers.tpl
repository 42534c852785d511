{{/* Object names: the release name, with "-muster" unless it already says muster. */}}
{{- define "muster.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else if contains "muster" .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-muster" .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{/* The pod labels the Deployment selects, the Service and the PDB match (as config/manager). */}}
{{- define "muster.selectorLabels" -}}
app.kubernetes.io/name: muster
app.kubernetes.io/component: controller
{{- end -}}

{{- define "muster.labels" -}}
{{ include "muster.selectorLabels" . }}
app.kubernetes.io/part-of: muster
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{/* The ServiceAccount every binding names. */}}
{{- define "muster.subject" -}}
- kind: ServiceAccount
  name: {{ include "muster.fullname" . }}
  namespace: {{ .Release.Namespace }}
{{- end -}}

{{/* Muster's config file: values.config, pointed at the mounted certificate if one is given. */}}
{{- define "muster.config" -}}
{{- $config := deepCopy .Values.config -}}
{{- if .Values.metrics.certSecretName -}}
{{- $server := get $config "server" | default dict -}}
{{- $_ := set $server "metrics_cert_dir" "/etc/muster/metrics-tls" -}}
{{- $_ := set $config "server" $server -}}
{{- end -}}
{{- toYaml $config -}}
{{- end -}}

{{- define "muster.priorityClassName" -}}
{{- if .Values.priorityClass.name -}}
{{- .Values.priorityClass.name -}}
{{- else if .Values.priorityClass.create -}}
{{- printf "%s-controller" (include "muster.fullname" .) -}}
{{- end -}}
{{- end -}}
