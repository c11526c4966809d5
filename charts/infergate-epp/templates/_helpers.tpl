{{/*
Name of the picker's objects: "<release>-epp", cut so that it stays a valid
DNS label (63 characters) with room for suffixes.
*/}}
{{- define "infergate-epp.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-epp" (.Release.Name | trunc 59 | trimSuffix "-") -}}
{{- end -}}
{{- end -}}

{{/*
Name of the InferencePool, which is also the picker's --pool-name.
*/}}
{{- define "infergate-epp.poolName" -}}
{{- .Values.inferencePool.name | default .Release.Name -}}
{{- end -}}

{{- define "infergate-epp.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- .Values.serviceAccount.name | default (include "infergate-epp.fullname" .) -}}
{{- else -}}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "infergate-epp.selectorLabels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: endpoint-picker
{{- end -}}

{{- define "infergate-epp.commonLabels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/part-of: infergate
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end -}}

{{/*
Labels of the picker's objects; the pool's carry its own component.
*/}}
{{- define "infergate-epp.labels" -}}
{{ include "infergate-epp.commonLabels" . }}
app.kubernetes.io/component: endpoint-picker
{{- end -}}

{{- define "infergate-epp.image" -}}
{{- printf "%s:%s" .Values.epp.image.repository (.Values.epp.image.tag | default .Chart.AppVersion) -}}
{{- end -}}

{{/*
The EndpointPickerConfig must at least be YAML: a typo found here fails the
install with a clear message instead of a crash-looping pod.
*/}}
{{- define "infergate-epp.checkedConfig" -}}
{{- $parsed := fromYaml .Values.epp.config -}}
{{- if hasKey $parsed "Error" -}}
{{- fail (printf "epp.config is not valid YAML: %s" (index $parsed "Error")) -}}
{{- end -}}
{{- if ne (index $parsed "kind" | default "") "EndpointPickerConfig" -}}
{{- fail "epp.config must be an EndpointPickerConfig (kind: EndpointPickerConfig, apiVersion: llm-d.ai/v1alpha1)" -}}
{{- end -}}
{{- .Values.epp.config -}}
{{- end -}}

{{/*
Checks the schema cannot express: the three listeners need three ports, and
a client CA needs TLS on (the picker refuses --client-ca-file without
--secure-serving, so the pods would crash-loop).
*/}}
{{- define "infergate-epp.validate" -}}
{{- if and .Values.epp.clientCASecretName (not .Values.epp.secureServing) -}}
{{- fail "epp.clientCASecretName needs epp.secureServing: mutual TLS is a TLS handshake, and the picker refuses --client-ca-file without --secure-serving" -}}
{{- end -}}
{{- $p := .Values.epp.ports -}}
{{- if or (eq (int $p.grpc) (int $p.health)) (eq (int $p.grpc) (int $p.metrics)) (eq (int $p.health) (int $p.metrics)) -}}
{{- fail (printf "epp.ports must be three different ports, got grpc %d, health %d, metrics %d" (int $p.grpc) (int $p.health) (int $p.metrics)) -}}
{{- end -}}
{{- end -}}

{{/*
NetworkPolicy peers allowed to the gRPC port when networkPolicy.from is
empty: the provider's gateway pods. Any namespace, since the Gateway usually
lives in another one than the picker. Istio and agentgateway both label the
Gateway pods they deploy with gateway.networking.k8s.io/gateway-name; the
envoy-gateway labels are Envoy Gateway's EnvoyAppLabel (v1.9,
internal/infrastructure/kubernetes/proxy/resource.go). With provider none
there is no gateway to name, and a guess would be an outage.
*/}}
{{- define "infergate-epp.gatewayPeers" -}}
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
