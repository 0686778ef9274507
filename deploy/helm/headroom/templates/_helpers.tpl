{{/* "headroom" unless overridden; object names are "<fullname>-agent". */}}
{{- define "headroom.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 50 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 50 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 50 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "headroom.agentName" -}}
{{- printf "%s-agent" (include "headroom.fullname" .) -}}
{{- end -}}

{{/* The ServiceAccount user the admission policy matches. */}}
{{- define "headroom.agentUser" -}}
{{- printf "system:serviceaccount:%s:%s" .Release.Namespace (include "headroom.agentName" .) -}}
{{- end -}}

{{- define "headroom.selectorLabels" -}}
app.kubernetes.io/name: headroom
app.kubernetes.io/component: agent
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "headroom.labels" -}}
app.kubernetes.io/name: headroom
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "headroom.agentLabels" -}}
{{ include "headroom.labels" . }}
app.kubernetes.io/component: agent
{{- end -}}

{{- define "headroom.image" -}}
{{- $repo := .Values.image.repository -}}
{{- if .Values.image.registry -}}{{- $repo = printf "%s/%s" .Values.image.registry $repo -}}{{- end -}}
{{- if .Values.image.digest -}}
{{- printf "%s@%s" $repo .Values.image.digest -}}
{{- else -}}
{{- printf "%s:%s" $repo (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}
{{- end -}}
