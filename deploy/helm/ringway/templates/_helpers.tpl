{{/*
Name of the DaemonSet and the ServiceAccount: "ztunnel" unless
resourceName says otherwise (istiod trusts that ServiceAccount name).
*/}}
{{- define "ringway.name" -}}
{{- .Values.resourceName | default "ztunnel" -}}
{{- end }}

{{/* Labels on every top-level resource. */}}
{{- define "ringway.labels" -}}
app.kubernetes.io/name: ringway
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: istio
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- with .Values.labels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/* Annotations on every top-level resource. */}}
{{- define "ringway.annotations" -}}
{{- $annotations := deepCopy (.Values.annotations | default dict) -}}
{{- if .Values.revision -}}
{{- $_ := set $annotations "istio.io/rev" .Values.revision -}}
{{- end -}}
{{- if $annotations -}}
{{ toYaml $annotations }}
{{- end -}}
{{- end }}

{{/* The container image. */}}
{{- define "ringway.image" -}}
{{- if contains "/" .Values.image -}}
{{ .Values.image }}
{{- else -}}
{{- $tag := .Values.tag | default .Chart.AppVersion | toString -}}
{{- $name := .Values.image | default "ringway" -}}
{{- with .Values.hub }}{{ . }}/{{ end }}{{ $name }}:{{ $tag }}{{ with .Values.variant }}-{{ . }}{{ end }}
{{- end -}}
{{- end }}

{{/* istiod's address for xDS and the CA when none is given. */}}
{{- define "ringway.istiod" -}}
istiod{{ with .Values.revision }}-{{ . }}{{ end }}.{{ .Values.istioNamespace }}.svc:15012
{{- end }}

{{/* An address as ringway wants it: with a scheme, https:// by default. */}}
{{- define "ringway.url" -}}
{{- if contains "://" . -}}
{{ . }}
{{- else -}}
https://{{ . }}
{{- end -}}
{{- end }}
