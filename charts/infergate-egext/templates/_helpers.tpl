{{/*
Name of the extension's objects: "<release>-egext", cut so that it stays a
valid DNS label (63 characters).
*/}}
{{- define "infergate-egext.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-egext" (.Release.Name | trunc 57 | trimSuffix "-") -}}
{{- end -}}
{{- end -}}

{{- define "infergate-egext.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- .Values.serviceAccount.name | default (include "infergate-egext.fullname" .) -}}
{{- else -}}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/* A ClusterRole is named across the cluster: its name carries the namespace. */}}
{{- define "infergate-egext.clusterRoleName" -}}
{{- printf "%s-%s" .Release.Namespace (include "infergate-egext.fullname" .) | trunc 253 | trimSuffix "-" -}}
{{- end -}}

{{/* The Service's fully qualified name, as Envoy Gateway and Envoy reach it. */}}
{{- define "infergate-egext.host" -}}
{{- printf "%s.%s.svc.%s" (include "infergate-egext.fullname" .) .Release.Namespace .Values.clusterDomain -}}
{{- end -}}

{{- define "infergate-egext.selectorLabels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: envoy-gateway-extension
{{- end -}}

{{- define "infergate-egext.labels" -}}
{{ include "infergate-egext.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/part-of: infergate
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end -}}

{{- define "infergate-egext.image" -}}
{{- printf "%s:%s" .Values.egext.image.repository (.Values.egext.image.tag | default .Chart.AppVersion) -}}
{{- end -}}

{{/*
NetworkPolicy peers allowed to the gRPC port when networkPolicy.from is
empty, in any namespace: Envoy Gateway's controller calls the extension's
hooks, and with EDS its proxies fetch the pools' endpoints from the same
port. The proxy labels are Envoy Gateway's EnvoyAppLabel (v1.9,
internal/infrastructure/kubernetes/proxy/resource.go).
*/}}
{{- define "infergate-egext.envoyGatewayPeers" -}}
- namespaceSelector: {}
  podSelector:
    matchLabels:
      control-plane: envoy-gateway
{{- if .Values.egext.eds }}
- namespaceSelector: {}
  podSelector:
    matchLabels:
      app.kubernetes.io/name: envoy
      app.kubernetes.io/component: proxy
      app.kubernetes.io/managed-by: envoy-gateway
{{- end -}}
{{- end -}}
