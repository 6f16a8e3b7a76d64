{{- /*
Kubernetes 1.30 or later (the chart's ValidatingAdmissionPolicies are v1). Not a kubeVersion in
Chart.yaml: `helm template` assumes Kubernetes 1.20 unless told otherwise, and would refuse to
render; here that assumed version (v1.20.0 exactly, which nobody runs) passes, and a real
cluster's is checked. Included by serviceaccount.yaml.
*/ -}}
{{- define "mcs.checkKubernetes" -}}
{{- $version := .Capabilities.KubeVersion.Version -}}
{{- if and (ne $version "v1.20.0") (not (semverCompare ">=1.30.0-0" $version)) -}}
{{- fail (printf "multicluster-scheduler needs Kubernetes 1.30 or later, not %s" $version) -}}
{{- end -}}
{{- end -}}
{{- define "mcs.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "mcs.serviceAccountName" -}}
{{- default (include "mcs.fullname" .) .Values.serviceAccount.name -}}
{{- end -}}

{{- define "mcs.selectorLabels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "mcs.labels" -}}
{{ include "mcs.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: multicluster-scheduler
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "mcs.webhookName" -}}
{{ include "mcs.fullname" . }}
{{- end -}}

{{- define "mcs.caSecretName" -}}
{{ include "mcs.fullname" . }}-webhook-ca
{{- end -}}

{{- define "mcs.manifestKeySecretName" -}}
{{ include "mcs.fullname" . }}-manifest-key
{{- end -}}

{{- define "mcs.certSecretName" -}}
{{ include "mcs.fullname" . }}-webhook-cert
{{- end -}}
