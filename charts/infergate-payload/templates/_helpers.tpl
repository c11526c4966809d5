{{/*
Name of the processor's objects: "<release>-payload", cut so that it stays a
valid DNS label (63 characters).
*/}}
{{- define "infergate-payload.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-payload" (.Release.Name | trunc 55 | trimSuffix "-") -}}
{{- end -}}
{{- end -}}

{{- define "infergate-payload.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- .Values.serviceAccount.name | default (include "infergate-payload.fullname" .) -}}
{{- else -}}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/*
A ClusterRole is named across the cluster, so its name carries the release
namespace: two releases of the same name in different namespaces must not
share one.
*/}}
{{- define "infergate-payload.clusterRoleName" -}}
{{- printf "%s-%s" .Release.Namespace (include "infergate-payload.fullname" .) | trunc 253 | trimSuffix "-" -}}
{{- end -}}

{{- define "infergate-payload.selectorLabels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: payload-processor
{{- end -}}

{{- define "infergate-payload.labels" -}}
{{ include "infergate-payload.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/part-of: infergate
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end -}}

{{- define "infergate-payload.image" -}}
{{- printf "%s:%s" .Values.payload.image.repository (.Values.payload.image.tag | default .Chart.AppVersion) -}}
{{- end -}}

{{/*
The namespace the processor watches for adapter ConfigMaps: its own, or
every one ("*") with multiNamespace.
*/}}
{{- define "infergate-payload.configMapNamespace" -}}
{{- if .Values.payload.adapterConfigMaps.multiNamespace -}}
*
{{- else -}}
{{- .Release.Namespace -}}
{{- end -}}
{{- end -}}

{{/*
Checks the schema cannot express: the three listeners need three ports, and
a client CA needs TLS on (the processor refuses --client-ca-file without
--secure-serving, so the pods would crash-loop).
*/}}
{{- define "infergate-payload.validate" -}}
{{- if and .Values.payload.clientCASecretName (not .Values.payload.secureServing) -}}
{{- fail "payload.clientCASecretName needs payload.secureServing: mutual TLS is a TLS handshake, and the processor refuses --client-ca-file without --secure-serving" -}}
{{- end -}}
{{- $p := .Values.payload.ports -}}
{{- if or (eq (int $p.grpc) (int $p.health)) (eq (int $p.grpc) (int $p.metrics)) (eq (int $p.health) (int $p.metrics)) -}}
{{- fail (printf "payload.ports must be three different ports, got grpc %d, health %d, metrics %d" (int $p.grpc) (int $p.health) (int $p.metrics)) -}}
{{- end -}}
{{- end -}}

{{/*
NetworkPolicy peers allowed to the gRPC port when networkPolicy.from is
empty: the provider's gateway pods. Any namespace, since the Gateway usually
lives in another one than the processor. Istio and agentgateway both label the
Gateway pods they deploy with gateway.networking.k8s.io/gateway-name; the
envoy-gateway labels are Envoy Gateway's EnvoyAppLabel (v1.9,
internal/infrastructure/kubernetes/proxy/resource.go). With provider none
there is no gateway to name, and a guess would be an outage.
*/}}
{{- define "infergate-payload.gatewayPeers" -}}
{{- $provider := .Values.provider.name -}}
{{- if or (eq $provider "istio") (eq $provider "agentgateway") -}}
- namespaceSelector: {}
  podSelector:
    matchExpressions:
      - key: gateway.networking.k8s.io/gateway-name
        operator: Exists
{{- else if eq $provider "envoy-gateway" -}}
- namespaceSelector: {}
  podSelector:
    matchLabels:
      app.kubernetes.io/name: envoy
      app.kubernetes.io/component: proxy
      app.kubernetes.io/managed-by: envoy-gateway
{{- else -}}
{{- fail (printf "networkPolicy.from is required with networkPolicy.enabled and provider.name %s: the chart cannot tell which pods are the gateway's" $provider) -}}
{{- end -}}
{{- end -}}
