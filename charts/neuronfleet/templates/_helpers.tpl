{{/* The release's full name, 63 characters at most (it names objects and labels). */}}
{{- define "neuronfleet.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{/* Cluster-scoped objects carry the namespace too: the same release name may live in two namespaces. */}}
{{- define "neuronfleet.clusterName" -}}
{{- printf "%s-%s" (include "neuronfleet.fullname" .) .Release.Namespace | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "neuronfleet.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "neuronfleet.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "neuronfleet.selectorLabels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: operator
{{- end -}}

{{- define "neuronfleet.labels" -}}
{{ include "neuronfleet.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end -}}

{{/* Labels of everything the operator creates for a service: what the monitors select. */}}
{{- define "neuronfleet.engineSelector" -}}
matchLabels:
  app.kubernetes.io/managed-by: neuronfleet-operator
matchExpressions:
  - {key: neuronfleet.io/service, operator: Exists}
{{- end -}}

{{/* Where the monitors look for engines: the watched namespaces, or all. */}}
{{- define "neuronfleet.engineNamespaces" -}}
{{- if .Values.watchNamespaces -}}
matchNames:
{{- range .Values.watchNamespaces }}
  - {{ . }}
{{- end }}
{{- else -}}
any: true
{{- end -}}
{{- end -}}
