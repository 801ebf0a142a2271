{{/* Names and labels. */}}
{{- define "gpuledger.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "gpuledger.fullname" -}}
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

{{/* The name of one component's objects: (dict "root" $ "component" "scheduler"). */}}
{{- define "gpuledger.componentName" -}}
{{- printf "%s-%s" (include "gpuledger.fullname" .root | trunc 50 | trimSuffix "-") .component }}
{{- end }}

{{- define "gpuledger.selectorLabels" -}}
app.kubernetes.io/name: {{ include "gpuledger.name" .root }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{- define "gpuledger.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .root.Chart.Name .root.Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "gpuledger.selectorLabels" . }}
app.kubernetes.io/version: {{ .root.Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .root.Release.Service }}
app.kubernetes.io/part-of: gpuledger
{{- end }}

{{- define "gpuledger.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}

{{/* kafka://BOOTSTRAP/PREFIX: the deployment's ledger (and intake) for the kube adapters and the projector. */}}
{{- define "gpuledger.kafkaUrl" -}}
{{- printf "kafka://%s/%s" (required "kafka.bootstrap is required" .Values.kafka.bootstrap) (required "kafka.prefix is required" .Values.kafka.prefix) }}
{{- end }}

{{/* Refuse security settings that cannot work, before anything reaches the cluster. */}}
{{- define "gpuledger.validate" -}}
{{- $k := .Values.kafka }}
{{- $protocols := list "" "PLAINTEXT" "SSL" "SASL_PLAINTEXT" "SASL_SSL" }}
{{- if not (has $k.securityProtocol $protocols) }}
{{- fail (printf "kafka.securityProtocol %q: expected one of PLAINTEXT, SSL, SASL_PLAINTEXT, SASL_SSL" $k.securityProtocol) }}
{{- end }}
{{- if not (has $k.sasl.mechanism (list "" "PLAIN" "SCRAM-SHA-256" "SCRAM-SHA-512")) }}
{{- fail (printf "kafka.sasl.mechanism %q: expected one of PLAIN, SCRAM-SHA-256, SCRAM-SHA-512" $k.sasl.mechanism) }}
{{- end }}
{{- if and (or $k.sasl.passwordKey $k.ssl.caKey $k.ssl.certKey $k.ssl.keyKey) (not $k.secret.name) }}
{{- fail "kafka.sasl.passwordKey and kafka.ssl.*Key name keys of a Secret: set kafka.secret.name" }}
{{- end }}
{{- if and $k.ssl.certKey (not $k.ssl.keyKey) }}
{{- fail "kafka.ssl.certKey needs kafka.ssl.keyKey (the client certificate's key)" }}
{{- end }}
{{- if lt (int .Values.scheduler.replicas) 1 }}
{{- fail "scheduler.replicas must be at least 1 (2: an active instance and a standby)" }}
{{- end }}
{{- end }}

{{/* The GPULEDGER_KAFKA_* environment of every Kafka client (only the settings given). */}}
{{- define "gpuledger.kafkaEnv" -}}
{{- $k := .Values.kafka }}
{{- $dir := $k.secret.mountPath -}}
- name: GPULEDGER_KAFKA
  value: {{ $k.bootstrap | quote }}
{{- with $k.securityProtocol }}
- name: GPULEDGER_KAFKA_SECURITY_PROTOCOL
  value: {{ . | quote }}
{{- end }}
{{- with $k.sasl.mechanism }}
- name: GPULEDGER_KAFKA_SASL_MECHANISM
  value: {{ . | quote }}
{{- end }}
{{- with $k.sasl.username }}
- name: GPULEDGER_KAFKA_SASL_USERNAME
  value: {{ . | quote }}
{{- end }}
{{- with $k.sasl.passwordKey }}
- name: GPULEDGER_KAFKA_SASL_PASSWORD_FILE
  value: {{ printf "%s/%s" $dir . | quote }}
{{- end }}
{{- with $k.ssl.caKey }}
- name: GPULEDGER_KAFKA_SSL_CAFILE
  value: {{ printf "%s/%s" $dir . | quote }}
{{- end }}
{{- with $k.ssl.certKey }}
- name: GPULEDGER_KAFKA_SSL_CERTFILE
  value: {{ printf "%s/%s" $dir . | quote }}
{{- end }}
{{- with $k.ssl.keyKey }}
- name: GPULEDGER_KAFKA_SSL_KEYFILE
  value: {{ printf "%s/%s" $dir . | quote }}
{{- end }}
{{- end }}

{{/*
A component's pod template: (dict "root" $ "component" "binder" "values" .Values.binder
"args" (list …) "token" false "ports" (list …) "dataVolume" (dict …)).
Volumes are the pod's own: /tmp (emptyDir), the Kafka Secret (read-only) and, for the
projector, its data volume; nothing is shared with another component.
*/}}
{{- define "gpuledger.podTemplate" -}}
{{- $root := .root }}
{{- $v := .values -}}
metadata:
  labels:
    {{- include "gpuledger.selectorLabels" . | nindent 4 }}
    {{- with $root.Values.podLabels }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
  {{- with $root.Values.podAnnotations }}
  annotations:
    {{- toYaml . | nindent 4 }}
  {{- end }}
spec:
  serviceAccountName: {{ include "gpuledger.componentName" . }}
  automountServiceAccountToken: {{ .token }}
  {{- with $root.Values.imagePullSecrets }}
  imagePullSecrets:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with $root.Values.priorityClassName }}
  priorityClassName: {{ . }}
  {{- end }}
  securityContext:
    {{- toYaml $root.Values.podSecurityContext | nindent 4 }}
  {{- with (default $root.Values.nodeSelector $v.nodeSelector) }}
  nodeSelector:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with (default $root.Values.tolerations $v.tolerations) }}
  tolerations:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with (default $root.Values.affinity $v.affinity | default .defaultAffinity) }}
  affinity:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  containers:
    - name: {{ .component }}
      image: {{ include "gpuledger.image" $root | quote }}
      imagePullPolicy: {{ $root.Values.image.pullPolicy }}
      args:
        {{- range .args }}
        - {{ . | quote }}
        {{- end }}
        {{- range $v.extraArgs }}
        - {{ . | quote }}
        {{- end }}
      env:
        {{- include "gpuledger.kafkaEnv" $root | nindent 8 }}
        {{- with .env }}
        {{- toYaml . | nindent 8 }}
        {{- end }}
      {{- with .ports }}
      ports:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      {{- with $v.livenessProbe }}
      livenessProbe:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      {{- with $v.readinessProbe }}
      readinessProbe:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      securityContext:
        {{- toYaml $root.Values.securityContext | nindent 8 }}
      {{- with $v.resources }}
      resources:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      volumeMounts:
        - {name: tmp, mountPath: /tmp}
        {{- if $root.Values.kafka.secret.name }}
        - {name: kafka-secrets, mountPath: {{ $root.Values.kafka.secret.mountPath | quote }}, readOnly: true}
        {{- end }}
        {{- with .dataVolume }}
        - {name: data, mountPath: /data}
        {{- end }}
    {{- with .sidecar }}
    {{- . | nindent 4 }}
    {{- end }}
  volumes:
    - {name: tmp, emptyDir: {}}
    {{- with $root.Values.kafka.secret.name }}
    - name: kafka-secrets
      secret: {secretName: {{ . | quote }}, defaultMode: 288}  # 0440: owner and fsGroup
    {{- end }}
    {{- with .dataVolume }}
    - name: data
      {{- toYaml . | nindent 6 }}
    {{- end }}
{{- end }}

{{/* A component's ServiceAccount; token: whether pods get an API token at all. */}}
{{- define "gpuledger.serviceAccount" -}}
apiVersion: v1
kind: ServiceAccount
metadata:
  name: {{ include "gpuledger.componentName" . }}
  namespace: {{ .root.Release.Namespace }}
  labels:
    {{- include "gpuledger.labels" . | nindent 4 }}
  {{- with .values.serviceAccount.annotations }}
  annotations:
    {{- toYaml . | nindent 4 }}
  {{- end }}
automountServiceAccountToken: {{ .token }}
{{- end }}

{{/*
A one-replica Deployment (ingestor, binder, projector, clock). Recreate: the old pod is gone
before the new one starts, so a rollout never runs two writers of the same role at once
(and the projector's own PVC, when enabled, is never wanted by two pods).
*/}}
{{- define "gpuledger.singleton" -}}
apiVersion: apps/v1
kind: Deployment
metadata:
  name: {{ include "gpuledger.componentName" . }}
  namespace: {{ .root.Release.Namespace }}
  labels:
    {{- include "gpuledger.labels" . | nindent 4 }}
spec:
  replicas: 1
  strategy: {type: Recreate}
  selector:
    matchLabels:
      {{- include "gpuledger.selectorLabels" . | nindent 6 }}
  template:
    {{- include "gpuledger.podTemplate" . | nindent 4 }}
{{- end }}

{{- /* The console's authenticating proxy (projector.console.authProxy): oauth2-proxy in the
     projector's pod, the only way in to `gpuledger serve`, which listens on the pod's
     loopback. Its client and cookie secrets come from a Secret, never from values. */}}
{{- define "gpuledger.consoleAuthProxy" -}}
{{- $root := .root }}
{{- $p := .proxy }}
{{- $secret := required "projector.console.authProxy.secret.name: a Secret with the OAuth client secret and the cookie secret" $p.secret.name }}
{{- $clientId := required "projector.console.authProxy.clientId: the OAuth client id registered with the provider" $p.clientId }}
{{- if and (eq $p.provider "oidc") (not $p.oidcIssuerUrl) }}
{{- fail "projector.console.authProxy.oidcIssuerUrl: the oidc provider needs its issuer URL" }}
{{- end }}
- name: auth-proxy
  image: {{ printf "%s:%s" $p.image.repository $p.image.tag | quote }}
  imagePullPolicy: {{ $p.image.pullPolicy }}
  args:
    - {{ printf "--http-address=0.0.0.0:%d" (int $p.port) | quote }}
    - {{ printf "--upstream=http://127.0.0.1:%d/" (int .upstreamPort) | quote }}
    - {{ printf "--provider=%s" $p.provider | quote }}
    {{- with $p.oidcIssuerUrl }}
    - {{ printf "--oidc-issuer-url=%s" . | quote }}
    {{- end }}
    {{- range $p.emailDomains }}
    - {{ printf "--email-domain=%s" . | quote }}
    {{- end }}
    - "--skip-provider-button=true"
    {{- range $p.extraArgs }}
    - {{ . | quote }}
    {{- end }}
  env:
    - {name: OAUTH2_PROXY_CLIENT_ID, value: {{ $clientId | quote }}}
    - name: OAUTH2_PROXY_CLIENT_SECRET
      valueFrom: {secretKeyRef: {name: {{ $secret | quote }}, key: {{ $p.secret.clientSecretKey | quote }}}}
    - name: OAUTH2_PROXY_COOKIE_SECRET
      valueFrom: {secretKeyRef: {name: {{ $secret | quote }}, key: {{ $p.secret.cookieSecretKey | quote }}}}
  ports:
    - {name: http, containerPort: {{ int $p.port }}}
  readinessProbe:
    httpGet: {path: /ready, port: http}
  livenessProbe:
    httpGet: {path: /ping, port: http}
  securityContext:
    {{- toYaml $root.Values.securityContext | nindent 4 }}
  {{- with $p.resources }}
  resources:
    {{- toYaml . | nindent 4 }}
  {{- end }}
{{- end }}
