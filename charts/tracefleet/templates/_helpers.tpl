{{- define "tracefleet.name" -}}
{{- .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "tracefleet.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "tracefleet.dashboardName" -}}
{{- printf "%s-dashboard" (include "tracefleet.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- /* The dashboard's URL as the operator names it in status.dashboardUrl: dashboard.url (an Ingress, a port
forward) or its Service's in-cluster name. */ -}}
{{- define "tracefleet.dashboardUrl" -}}
{{- default (printf "http://%s.%s.svc:%v" (include "tracefleet.dashboardName" .) .Release.Namespace .Values.dashboard.port) .Values.dashboard.url -}}
{{- end -}}

{{- define "tracefleet.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{ include "tracefleet.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{- define "tracefleet.selectorLabels" -}}
app.kubernetes.io/name: {{ include "tracefleet.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: operator
{{- end -}}

{{- define "tracefleet.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "tracefleet.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/* REGISTRY/NAME:TAG, as `tracefleet images build --registry REGISTRY --tag TAG` names its images. */}}
{{- define "tracefleet.imageRef" -}}
{{- $registry := required "image.registry: name the registry you pushed the images to (make images REGISTRY=registry.example.com/team TAG=0.1.0 PUSH=1, then --set image.registry=registry.example.com/team --set image.tag=0.1.0; docs/kubernetes/images.md)" .root.Values.image.registry -}}
{{- printf "%s/%s:%s" (trimSuffix "/" $registry) .name (default .root.Chart.AppVersion .root.Values.image.tag) -}}
{{- end -}}

{{/* The Secrets every job's pods pull with: operator.jobImagePullSecrets, else (null) the operator's own. */}}
{{- define "tracefleet.jobPullSecrets" -}}
{{- if kindIs "invalid" .Values.operator.jobImagePullSecrets -}}
{{- range .Values.imagePullSecrets }}{{ .name }},{{ end -}}
{{- else -}}
{{- range .Values.operator.jobImagePullSecrets }}{{ . }},{{ end -}}
{{- end -}}
{{- end -}}

{{- define "tracefleet.image" -}}
{{- include "tracefleet.imageRef" (dict "root" . "name" .Values.image.repository) -}}
{{- end -}}

{{/* The operator's own image: the tracefleet image plus the operator's packages. */}}
{{- define "tracefleet.operatorImage" -}}
{{- include "tracefleet.imageRef" (dict "root" . "name" .Values.image.operatorRepository) -}}
{{- end -}}

{{/* The operator's --harness-image template: the harness image of each preset ({preset} kept for the operator). */}}
{{- define "tracefleet.harnessImage" -}}
{{- include "tracefleet.imageRef" (dict "root" . "name" "harness-{preset}") -}}
{{- end -}}

{{/* The namespaces the operator serves when not cluster-wide: the listed ones, else the release namespace. */}}
{{- define "tracefleet.roleNamespaces" -}}
{{- if .Values.operator.watchNamespaces -}}
{{- join "," .Values.operator.watchNamespaces -}}
{{- else -}}
{{- .Release.Namespace -}}
{{- end -}}
{{- end -}}

{{/* Least privilege: exactly the verbs the reconcile uses, in the namespaces it serves (rbac.yaml). Secrets: `get`
     only, read when a job names one (rbac.secretNames narrows it to those names). Harness pods get no RBAC at all. */}}
{{- define "tracefleet.rules" -}}
- apiGroups: ["tracefleet.io"]
  resources: ["rolloutjobs"]
  verbs: ["get", "list", "watch", "patch", "delete"]
- apiGroups: ["tracefleet.io"]
  resources: ["rolloutjobs/status"]
  verbs: ["get", "patch"]
- apiGroups: [""]
  resources: ["pods"]
  verbs: ["get", "list", "watch", "create", "delete"]
- apiGroups: [""]
  resources: ["services"]
  verbs: ["get", "list", "watch", "create"]
- apiGroups: [""]
  resources: ["configmaps"]
  verbs: ["get", "create"]
- apiGroups: [""]
  resources: ["secrets"]
  verbs: ["get"]
  {{- with .Values.rbac.secretNames }}
  resourceNames: {{ toJson . }}
  {{- end }}
# each job's engine key (<job>-engine-key, owned by the job): create only, never read back, listed or changed
- apiGroups: [""]
  resources: ["secrets"]
  verbs: ["create"]
- apiGroups: ["", "events.k8s.io"]
  resources: ["events"]
  verbs: ["create", "patch"]
- apiGroups: ["apps"]
  resources: ["deployments"]
  verbs: ["get", "list", "watch", "create", "patch", "delete"]
- apiGroups: ["batch"]
  resources: ["jobs"]
  verbs: ["get", "list", "watch", "create", "patch", "delete"]
- apiGroups: ["networking.k8s.io"]
  resources: ["networkpolicies"]
  verbs: ["get", "create"]
{{- end -}}

{{/* Non-empty when the operator runs with the Lease: asked for, or implied by more than one replica. */}}
{{- define "tracefleet.leaderElection" -}}
{{- if or .Values.operator.leaderElection.enabled (gt (int .Values.operator.replicas) 1) -}}true{{- end -}}
{{- end -}}
