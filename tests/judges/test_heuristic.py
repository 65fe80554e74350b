"""The offline judge's signals: behaviour, not tuned figures."""

from __future__ import annotations

import threading
from fractions import Fraction

import pytest

from triage.domain.ports import JudgeRequest
from triage.domain.records import Facts, Passage, ToolCall, Trace
from triage.domain.rule import decide
from triage.judges.heuristic import HeuristicJudge, unsupported
from triage.judges.offline import containment as cont
from triage.judges.offline.contradictions import (
    affirmed_negations,
    negation_contradictions,
    pairs,
    restriction_contradictions,
    value_contradictions,
)
from triage.judges.offline.declines import absence_cues, declines, listed_phrases
from triage.judges.offline.grounding import (
    Grounding,
    answer_text,
    arithmetic,
    bound_names,
    check,
    invisible_marks,
    outside_support,
    quoted_spans,
    unsupported_specifics,
)
from triage.judges.offline.text import (
    Pool,
    fenced_code,
    looks_english,
    specifics,
    stem,
    without_code,
    word_set,
)


def test_words_meet_across_forms_and_identifiers() -> None:
    assert stem("reused") == stem("reusing") == stem("reuse")
    assert {"min", "trial", "requir"} <= word_set("min_trials_required")
    assert "metric" in word_set("metricStrategies")
    assert word_set("kube\u200bctl") == word_set("kubectl")
    # a compound is stemmed whole too, so its plural and lower-case forms meet it
    assert word_set("SparkApplications") & word_set("a SparkApplication")
    assert word_set("KServe") & word_set("kserve")


def test_an_acronyms_plural_meets_the_acronym() -> None:
    # `GPUs`: the `s` is a plural, not the tail of a word in -us (`status`); `APIs` is no -is word
    assert word_set("GPUs") == word_set("GPU") == {"gpu"}
    assert word_set("REST APIs") >= word_set("API")
    assert word_set("multi-GPUs") >= {"multi", "gpu"}
    assert word_set("CRDs") == word_set("CRD")
    assert stem("status") == "status"


def test_a_past_tense_in_ied_meets_its_verb() -> None:
    assert stem("specified") == stem("specifies") == stem("specify")
    assert stem("copied") == stem("copy")
    assert stem("applied") == stem("applies") == stem("apply")
    assert stem("tied") == "tied"  # too short to be a -y verb


def test_a_verb_in_ply_is_no_adverb() -> None:
    assert stem("apply") == stem("applies") == stem("applied") != stem("apps")
    assert stem("supply") != stem("sup")
    assert stem("directly") == stem("direct")


def test_an_accented_word_is_not_cut_into_ascii_pieces() -> None:
    assert word_set("configuración") == {"configuración"}
    assert word_set("Überprüfung der Größe") == {"überprüfung", "der", stem("größe")}
    assert word_set("ÉtatInitial") >= {"état", "initial"}
    assert word_set("metricStrategies") >= {"metric", "strategy"}


def test_an_identifier_inside_cjk_text_is_read_whole_too() -> None:
    assert word_set("SparkApplicationsの設定") >= word_set("a SparkApplication")
    assert word_set("min_trials_requiredを使う") >= word_set("min_trials_required")
    assert word_set("KFPでパイプライン") >= {"kfp", "パイ"}


def test_a_contraction_is_no_content_word() -> None:
    assert word_set("it doesn't work") == word_set("it isn’t running") - {"run"} == set()
    assert word_set("the pod wasn't scheduled") == {"pod", "schedul"}


def test_english_around_code_is_english() -> None:
    answer = (
        "Yes: `manifests/v1beta1/katib-controller/katib-config.yaml`. Its `trialTemplate` has"
        " `apiVersion: batch.kubeflow.org/v1beta1`, `kind: PyTorchJob`, uses `retain: true` with"
        " `primaryContainerName: training-container`.\n\nhttps://github.com/kubeflow/katib/blob/master/README.md"
    )
    assert looks_english(answer)
    assert looks_english("Use the endpoint on port `9090`:\n\n```python\nregistry = ModelRegistry(port=9090)\n```")
    assert not looks_english("`kfp.compile` 関数を使います：\n\n```python\nimport kfp\n```")
    assert not looks_english("Setze im Decorator `@dsl.component(cache=False)`, dann wird die Komponente geladen.")


def test_full_width_letters_and_decomposed_accents_meet_the_ordinary_ones() -> None:
    assert word_set("ＫＦＰでＧＰＵを") >= {"kfp", "gpu"}
    assert word_set("configuracio\u0301n") == word_set("configuración")


def test_a_doubled_l_before_ed_or_ing_meets_its_base() -> None:
    assert stem("controlled") == stem("controlling") == stem("control")
    assert stem("installed") == stem("installing") == stem("install") == stem("installs")
    assert stem("labelled") == stem("labeled") == stem("label")
    assert stem("called") == stem("call")


def test_a_word_in_ie_meets_its_plural() -> None:
    assert stem("cookie") == stem("cookies")
    assert stem("movie") == stem("movies")
    assert stem("tie") == "tie"


def test_a_verb_in_eed_meets_its_forms() -> None:
    assert stem("succeed") == stem("succeeded") == stem("succeeding") == stem("succeeds")
    assert stem("exceed") == stem("exceeded")
    assert stem("agreed") == stem("agree")
    assert stem("need") == stem("needed") == stem("needs")


def test_a_two_letter_acronym_counts_as_a_part_too() -> None:
    assert word_set("AI/ML workloads") >= word_set("AI and ML")
    assert "ui" in word_set("a UI-based flow")
    assert "in" not in word_set("built-in")


def test_pool_weighs_a_word_no_passage_holds_most() -> None:
    pool = Pool(["katib experiment trial", "katib experiment", "katib"])
    assert pool.idf("tpu") > pool.idf("experiment") > pool.idf("katib")
    assert pool.weighted_coverage({"katib", "tpu"}, word_set("katib")) < 0.5


@pytest.mark.parametrize(
    "answer",
    [
        "I couldn't find anything about that in the documentation.",
        "The overview says nothing about TPUs, so I can't confirm it.",
        "I found no documented way to set a per-task timeout.",
        "The page doesn't cover dynamic allocation.",
        "The pages I found don't say where the registry keeps its data.",
        "Neither mentions a database.",
        "No encontré información sobre eso en la documentación.",
        "Je n'ai pas trouvé cette option dans la documentation.",
        "Ich habe dazu in der Dokumentation nichts gefunden.",
        "ドキュメントには記載がありません。",
        "文档中没有提到这个功能。",
    ],
)
def test_declines_in_several_languages(answer: str) -> None:
    assert declines(answer)


@pytest.mark.parametrize(
    "answer",
    [
        "We couldn't find a documented way to pause a TrainJob.",
        "We were unable to locate that setting in the Katib docs.",
        "We found nothing about GPU quotas for notebooks.",
    ],
)
def test_a_decline_in_the_first_person_plural(answer: str) -> None:
    assert declines(answer)


@pytest.mark.parametrize(
    "answer", ["I could not\nfind it in the docs.", "I could not\u00a0find it.", "The docs  do not  mention it."]
)
def test_a_decline_phrase_across_a_line_break_or_odd_space(answer: str) -> None:
    assert declines(answer)


def test_a_decline_phrase_in_code_is_a_quotation() -> None:
    assert not declines("Docker prints `Unable to find image 'trainer:latest' locally`; pull the image first.")
    assert not declines("The pod logs show:\n\n```\nunable to locate package\n```\n\nAdd the apt source.")
    assert declines("I could not find `maxRetries` in the docs.")


@pytest.mark.parametrize(
    "answer",
    [
        # the texts named as agents name them, and what they fail to do
        "The provided context does not contain the default retry count.",
        "The retrieved documents don't seem to address quota per profile.",
        "None of the passages I retrieved talk about TLS for the gateway.",
        "The excerpts are silent on how long events are kept.",
        "The guides offer no explanation for the restart loop.",
        "This question falls outside what my sources cover.",
        # the agent's own search, in its words
        "I haven't been able to find a page on air-gapped installs.",
        "I'm unable to determine the default from the docs.",
        "My search didn't turn up anything on Tekton trial templates.",
        "Searching for 'multi-cluster' got zero hits.",
        "The retrieved text is insufficient to determine the Istio version.",
        "I'm not aware of any documented way to schedule a shutdown.",
        # beyond the first ten languages
        "Ik heb hierover niets kunnen vinden.",
        "Nie udało mi się znaleźć tej opcji w dokumentacji.",
        "Bu ayar dokümanlarda belirtilmemiş.",
        "На жаль, у джерелах немає відповіді на це питання.",
        "Không tìm thấy thông tin về tùy chọn này.",
        "Maaf, dokumen yang saya temukan tidak membahas hal ini.",
        "取得した資料では触れられていないため、お答えできません。",
        "文件中沒有提到這個設定。",
    ],
)
def test_declines_in_the_forms_agents_write_them(answer: str) -> None:
    assert declines(answer)


@pytest.mark.parametrize(
    "answer",
    [
        "JAX is not supported by Kubeflow Trainer.",
        "Set `parallelism: 2` on the loop.",
        "",
        # a question about the user's setup, then the answer
        "I'm not sure which Katib version you run, but `tune()` takes `resources_per_trial`.",
        "If you are not sure which namespace it is in, run `kubectl get ns`.",
        "Kubectl prints `couldn't find any resources`; create the namespace first.",
        "If the namespace is not specified, the profile's namespace is used.",
        "O Spark Operator não cria o pod do driver fora de `spark.jobNamespaces`.",
    ],
)
def test_a_claim_is_not_a_decline(answer: str) -> None:
    assert not declines(answer)


@pytest.mark.parametrize(
    "answer",
    [
        "Sorry: none of the four results I got back explain the retry budget.",
        "The material in front of me never spells out the upgrade order.",
        "That part is not in the pages I was given.",
        "Came up short here — the overview I found stops short of the quota rules.",
        "i dont know this one, the guide not say it",
        # emphasis is no part of a phrase, and a status line is a decline too
        "I looked, but the pages _don't cover_ quotas.",
        "**Not found in the docs.** Try the Slack channel.",
        'Answer: unknown\nReason: the search returned 0 results for "quota"',
    ],
)
def test_a_sentence_naming_the_sources_and_saying_they_do_not_tell_declines(answer: str) -> None:
    assert declines(answer)


@pytest.mark.parametrize(
    "answer",
    [
        "The docs say you don't need to restart: the controller reloads the ConfigMap.",
        "The UI doesn't show the logs; run `kubectl logs` on the trial pod.",
        "I found the setting: `maxFailedTrialCount` stops the experiment; nothing else is needed.",
        "No, there is no need to recreate the profile.",
        "I can't see your cluster, but a crash loop right after install usually means MySQL is not ready.",
        "No se puede ejecutar un pipeline v2 en un servidor 1.x.",
    ],
)
def test_naming_the_docs_beside_a_negation_is_no_decline(answer: str) -> None:
    assert not declines(answer)


def test_specifics_of_an_answer() -> None:
    found = specifics(
        "Use `kfp dsl compile` with --output, set CD_REGISTRATION_FLOW, see v2.1 and SubprocessRunner."
    )
    assert {"kfp dsl compile", "--output", "CD_REGISTRATION_FLOW", "v2.1", "SubprocessRunner"} <= set(found)
    assert "e.g" not in specifics("Check it, e.g. with kubectl.")


def test_a_unit_symbol_is_no_identifier() -> None:
    found = specifics("This provisions a 5 GiB volume (size 10Gi) on a 2.4 GHz node; see GiBCounter.")
    assert "GiB" not in found and "GHz" not in found
    assert {"10Gi", "2.4", "GiBCounter"} <= set(found)
    assert unsupported("A 5 GiB volume from `standard`.", ["size='5Gi', storage_class_name='standard'"]) == []


def test_markdown_emphasis_is_no_part_of_a_specific() -> None:
    assert specifics("Open the __Manage Contributors__ tab, then _Save_.") == []
    assert specifics("Read **https://www.kubeflow.org/docs/started/**.") == ["https://www.kubeflow.org/docs/started/"]
    assert specifics("Define __init__ and call _create_cluster_op or my_var.") == [
        "__init__",
        "_create_cluster_op",
        "my_var",
    ]


def test_a_number_with_thousands_separators_is_one_number() -> None:
    assert specifics("Katib ran 1,000 trials and 10,000,000 steps.") == ["1,000", "10,000,000"]
    assert specifics("Open ports 8080,9090 and 443.") == ["8080", "9090", "443"]
    assert unsupported_specifics("Up to 1,000 trials.", ["maxTrialCount: 1000"]) == ([], 1)
    assert unsupported_specifics("Up to 2,000 trials.", ["maxTrialCount: 1000"]) == ([], 1)  # 1000 + 1000
    assert unsupported_specifics("Up to 1,000 trials.", ["maxTrialCount: 1,000"]) == ([], 1)
    assert unsupported_specifics("Allow 1000 of them.", ["up to 1,000 trials"]) == ([], 1)


def test_a_code_span_with_a_url_is_read_whole() -> None:
    found = specifics("Point it at the store: `storageUri: s3://models/iris` or `storageUri: http://minio:9000/iris`.")
    assert found == ["http://minio:9000/iris", "storageUri: s3://models/iris", "storageUri: http://minio:9000/iris"]


def test_a_url_ends_where_cjk_text_begins() -> None:
    url = "https://www.kubeflow.org/docs/components/pipelines/"
    assert specifics(f"詳しくは{url}を参照してください。") == [url]
    assert specifics(f"参见{url}。") == [url]
    assert specifics(f"見てください（{url}）") == [url]


def test_specifics_in_cjk_text_without_spaces() -> None:
    spaced = "Katib では設定 spec.parallelTrialCount を 3 にし、ポート 9090 で metrics_collector を起動。1.9 以降。"
    assert specifics(spaced.replace(" ", "")) == specifics(spaced) == [
        "spec.parallelTrialCount",
        "metrics_collector",
        "1.9",
        "9090",
    ]


def test_a_number_is_seen_only_as_a_whole_number() -> None:
    seen = ["The gRPC port is 9090; Kubeflow 1.10 needs 16 GB."]
    assert unsupported_specifics("Use port 90.", seen)[0] == ["90"]
    assert unsupported_specifics("It has 10 replicas.", seen)[0] == ["10"]
    assert unsupported_specifics("Use port 9090 with 16 GB.", seen)[0] == []
    assert unsupported_specifics("Use port 90.", seen, question="Is port 9090 right?")[0] == ["90"]


def test_function_words_with_a_slash_are_no_identifier() -> None:
    assert specifics("Set the flag on/off and/or restart the pod.") == []
    assert specifics("Use kubeflow/pipelines and self.name.") == ["kubeflow/pipelines", "self.name"]


def test_exempt_specifics_question_placeholders_arithmetic() -> None:
    seen = ["Set `parallelTrialCount: 3` and `maxTrialCount: 12`.", "kubectl get pods -n kubeflow"]
    answer = (
        "With `parallelTrialCount: 3` and 12 trials you get 4 rounds; run `kubectl get pods -n <namespace>`."
    )
    missing, _ = unsupported_specifics(answer, seen, question="")
    assert missing == []  # 4 = 12 / 3, and <namespace> is a placeholder
    missing, _ = unsupported_specifics(
        "Use `team-b` and port 9090.", ["port 8080"], question="my team-b namespace"
    )
    assert missing == ["9090"]


def test_the_questions_words_joined_are_the_questions_own() -> None:
    question = "I wrote a simulated annealing suggestion service. What is the max trial count?"
    answer = "Register `simulated-annealing`, keep `max_trial_count` and --max-trial-count low; `annealing-v2` is new."
    missing, _ = unsupported_specifics(answer, ["Katib suggestion services"], question=question)
    assert missing == ["annealing-v2"]  # joined words must all be the question's, in its order


def test_arithmetic_on_shown_numbers() -> None:
    shown = {Fraction(12), Fraction(3)}
    assert arithmetic("4", shown) and arithmetic("36", shown) and arithmetic("15", shown)
    assert not arithmetic("7", shown)


def test_a_seen_call_with_other_seen_arguments_is_supported() -> None:
    seen = ["task.set_caching_options(False) turns caching off; True keeps it."]
    assert unsupported_specifics("Call `.set_caching_options(True)`.", seen)[0] == []
    assert unsupported_specifics("Call `kfp.compile(p)`.", ["kfp", "compile"])[0] == ["kfp.compile(p)"]


def test_an_invisible_character_inside_a_word_is_not_grounded() -> None:
    passage = "Run kubectl logs my-pod."
    g = check("Run `kube\u200bctl logs my-pod`.", [passage], [passage])
    assert not g.grounded and any("invisible" in u for u in g.unsupported)


def test_a_byte_order_mark_or_an_emoji_joiner_is_no_invisible_character_in_a_word() -> None:
    assert invisible_marks("\ufeffRun `kubectl apply -f pipeline.yaml`.") == []
    assert invisible_marks("Done \U0001f9d1\u200d\U0001f4bb: run `kubectl apply`.") == []
    assert invisible_marks("Run `kube\u200bctl apply`.") == ["kubectl (with an invisible character)"]


def test_a_swapped_value_contradicts_the_passage() -> None:
    passages = ["registry = ModelRegistry(port=8080)", "The gRPC port is 9090."]
    assert value_contradictions("Connect with port=9090.", passages[:1], passages)
    assert not value_contradictions("Connect with port=8080.", passages[:1], passages)
    # an unseen value is an unsupported specific, not also a contradiction
    assert not value_contradictions("Connect with port=7777.", passages[:1], passages)


def test_a_value_the_question_supplies_is_the_users_own() -> None:
    passages = ["metadata:\n  name: profileName\nspec:\n  owner:\n    name: admin@example.com"]
    question = "How do I create a profile owned by dana@acme.io?"
    answer = "owner:\n  name: dana@acme.io"
    seen = [question, *passages]
    assert not value_contradictions(answer, passages, seen, question)
    assert value_contradictions(answer, passages, [*seen, "dana@acme.io"])  # not asked: a swap
    # grounded, but as an example filled in: never clear-cut, the example may not fit the question
    assert check(answer, seen, passages, question).filled == ["name: dana (the passages give admin, profilename)"]


def test_a_file_named_after_the_questions_name_is_the_questions_own() -> None:
    question = "How do I create a profile named ml-research?"
    answer = "Save it as `ml-research.yaml` (or `profile.yaml`) and apply it with kubectl."
    missing, _ = unsupported_specifics(answer, ["kubectl apply -f"], question=question)
    assert missing == ["profile.yaml"]


def test_a_documented_template_filled_in_is_seen() -> None:
    seen = ["roleRef:\n  kind: ClusterRole\n  name: kubeflow-<USER_ROLE>\n<USER_ROLE> is edit or view; <NAME> any"]
    answer = "Bind `ClusterRole/kubeflow-view` (or `kubeflow-edit`), not `view-kubeflow`."
    missing, _ = unsupported_specifics(answer, seen)
    assert missing == ["view-kubeflow"]  # `<NAME>` alone is no template: it would fit anything
    assert unsupported_specifics("Use `team-a`.", seen)[0] == ["team-a"]


def test_templates_are_read_in_linear_time() -> None:
    # a leading `[\w./:-]*` tried from every position of a long word was quadratic (a minute here)
    seen = ["x" * 200_000 + " kubeflow-<USER_ROLE>"]
    done = threading.Event()
    worker = threading.Thread(
        target=lambda: (unsupported_specifics("Use `kubeflow-view`.", seen), done.set()), daemon=True
    )
    worker.start()
    assert done.wait(10), "template search is quadratic: a guard against a catastrophic regex, not a speed target"


def test_a_sentences_period_is_no_part_of_a_value() -> None:
    passages = ["registry = ModelRegistry(port=8080)"]
    assert pairs("Connect with port=8080.")["port"] == {"8080"}
    assert not value_contradictions("Connect with port=8080.", passages, [*passages, "It listens on 8080."])
    assert not value_contradictions("ModelRegistry(port=...)", passages)


def test_a_yaml_mapping_key_has_no_value() -> None:
    spec = "objective:\n  type: maximize\n  objectiveMetricName: accuracy\n"
    assert pairs(spec) == {"type": {"maximize"}, "objectivemetricname": {"accuracy"}}
    assert value_contradictions("objective:\n  type: minimize", [spec], [spec, "or minimize"])


def test_free_text_after_a_label_is_no_value() -> None:
    passages = ["Note: if the controller restarts, trials resume.", "description: How to run a pipeline"]
    assert not value_contradictions("Note: the trials resume. description: A guide", passages)
    assert pairs("enabled: no") == {"enabled": {"no"}}


def test_a_url_value_is_read_whole() -> None:
    passages = ['client = ModelRegistry(server_address="http://model-registry-service.kubeflow", port=8080)']
    assert pairs(passages[0])["server_address"] == {"http://model-registry-service.kubeflow"}
    assert pairs("image: python:3.11")["image"] == {"python:3.11"}
    # another URL is a swapped value; the URL the passage gives is none
    seen = [*passages, "or https://registry.internal:8443"]
    assert value_contradictions("Set server_address=https://registry.internal:8443", passages, seen)
    assert not value_contradictions("server_address: http://model-registry-service.kubeflow", passages)


def test_a_negation_contradicts_a_positive_passage() -> None:
    passages = ["Kubeflow Trainer supports frameworks including PyTorch, MLX, JAX and XGBoost."]
    assert negation_contradictions("JAX and MLX are not supported.", passages)
    assert not negation_contradictions("TPUs are not supported.", passages)


def test_a_term_a_passage_denies_stated_by_the_answer_is_found() -> None:
    """The reverse of a negated answer: the passage denies a term ("non-default", "not
    recommended"), an answer sentence on the same subject states it with no negation."""
    passages = [
        "Caching is enabled for non-default pipeline roots only after the admin sets the flag.",
        "Running the metadata store on SQLite is not recommended for shared clusters.",
    ]
    assert affirmed_negations("Caching is enabled for default pipeline roots at once.", passages) == ["default"]
    assert affirmed_negations("SQLite is the recommended metadata store for shared clusters.", passages) == [
        "recommended"
    ]
    # said with the passage's own negation, on another subject, or a word that claims nothing
    assert not affirmed_negations("Caching works for non-default pipeline roots.", passages)
    assert not affirmed_negations("SQLite is not recommended for shared clusters.", passages)
    assert not affirmed_negations("The default image is python:3.11.", passages)
    assert not affirmed_negations("It is only a flag.", ["This is not only a flag for the admin."])


def test_grounding_is_never_sure_where_the_answer_states_what_a_passage_denies() -> None:
    affirmed = Grounding(checked=4, prose_support=0.97, affirmed=["recommended"])
    assert _grounding_confidence(affirmed) == "medium"
    assert _grounding_confidence(Grounding(checked=4, prose_support=0.97)) == "high"
    passages = ["Running the metadata store on SQLite is not recommended for shared clusters."]
    answer = "SQLite is the recommended metadata store for shared clusters."
    found = check(answer, passages, passages)
    assert found.grounded and found.affirmed == ["recommended"]


def test_a_negation_with_a_typographic_apostrophe() -> None:
    passages = ["Kubeflow Trainer supports frameworks including PyTorch, MLX, JAX and XGBoost."]
    assert negation_contradictions("JAX and MLX aren\u2019t supported.", passages)
    # a passage sentence that negates with `’` is no positive statement
    negated = ["Kubeflow Trainer doesn\u2019t support frameworks such as JAX or MLX."]
    assert not negation_contradictions("JAX and MLX are not supported.", negated)


def test_no_answer_is_neither_grounded_nor_a_decline() -> None:
    assert check("   ", ["anything"], ["anything"]).grounded is False


def test_a_json_answer_is_read_for_its_text() -> None:
    text = answer_text('{"answer": "It reads /var/log/metrics.log.", "confidence": 0.93}')
    assert "metrics.log" in text and "0.93" not in text


def test_prose_written_from_memory_is_weakly_supported() -> None:
    seen = ["The Central Dashboard shows namespaces and the pipelines of each profile."]
    faithful = check(
        "The Central Dashboard shows the namespaces and the pipelines of each profile.", seen, seen
    )
    invented = check(
        "Open the account menu, choose Change password and type a fresh secret twice.", seen, seen
    )
    assert faithful.prose_support is not None and invented.prose_support is not None
    assert faithful.prose_support > invented.prose_support


def test_a_non_english_question_is_read_through_the_agents_queries() -> None:
    assert not looks_english("KFPでパイプラインをYAMLファイルにコンパイルするには？")
    assert looks_english("How do I compile a pipeline to YAML?")
    calls = [ToolCall(id="t1", name="search", args={"query": "kfp compile pipeline yaml"}, collection="docs")]
    assert {"compil", "pipelin"} <= cont.question_terms("KFPでパイプラインをコンパイルするには？", calls)


PAGE = Passage(
    id="R1",
    collection="docs",
    source_url="https://docs/x",
    text="Median stopping: min_trials_required defaults to 3, start_step to 4.",
)
NOISE = [
    Passage(id=f"S{i}", collection="docs", source_url=f"https://docs/n{i}", text=text)
    for i, text in enumerate(
        ["Katib runs experiments.", "Katib trials report metrics.", "Notebooks run pods."], 2
    )
]


def test_containment_a_passage_with_the_rare_words_holds_a_gap_holds_nothing() -> None:
    q = "What are the defaults of min_trials_required and start_step in Katib?"
    found = cont.contain(q, "3 and 4.", [], [PAGE], [PAGE, *NOISE], answer_counts=True)
    assert found.retrieved_holds and found.index_holds
    gap = cont.contain("Does Katib support TPU quotas?", "No.", [], [NOISE[0]], NOISE, answer_counts=True)
    assert not gap.retrieved_holds and gap.index_holds is False


def test_containment_a_better_passage_elsewhere_outranks_a_weak_retrieved_one() -> None:
    q = "What are the defaults of min_trials_required and start_step in Katib?"
    found = cont.contain(q, "Katib runs experiments.", [], [NOISE[0]], [*NOISE, PAGE], answer_counts=True)
    assert found.outranked and not found.retrieved_holds and found.index_holds


def test_containment_the_answers_specifics_bridge_the_users_words() -> None:
    # the user's words are not the docs' words: the passage covers little of the question, but the
    # answer's specifics are the passage's, and no passage elsewhere covers the question better
    q = "How long does the tuner wait before it gives up on a hopeless try, and after how many tries?"
    answer = "It uses `min_trials_required` (default 3) and `start_step` (default 4)."
    found = cont.contain(q, answer, [], [PAGE], [PAGE, *NOISE], answer_counts=True)
    assert found.answer_support == 1.0 and found.retrieved_best is not None
    assert found.retrieved_best.coverage + cont.ANSWER_WEIGHT < cont.HOLD_THRESHOLD
    assert found.supported and found.retrieved_holds
    # ... but not when a passage elsewhere covers the question clearly better
    text = "The tuner gives up on a hopeless try: how long it waits."
    elsewhere = Passage(id="S9", collection="docs", source_url="https://docs/y", text=text)
    rival = cont.contain(q, answer, [], [PAGE], [PAGE, *NOISE, elsewhere], answer_counts=True)
    assert not rival.supported and not rival.retrieved_holds


def test_containment_a_better_section_of_a_retrieved_page_outranks_the_one_shown() -> None:
    q = "What are the defaults of min_trials_required and start_step in Katib?"
    shown = Passage(id="R1", collection="docs", source_url="https://docs/x", text="Katib runs experiments.")
    found = cont.contain(q, "Katib runs experiments.", [], [shown], [*NOISE, PAGE], answer_counts=True)
    assert found.outranked and not found.retrieved_holds and found.index_holds


def test_containment_a_passage_without_the_subject_is_a_lexical_trap() -> None:
    q = "Can Katib send an email when an experiment finishes?"
    shown = [
        Passage(id="R1", collection="docs", source_url="https://docs/k", text="Katib experiment status."),
        Passage(id="R2", collection="docs", source_url="https://docs/u", text="The Katib UI lists experiments."),
    ]
    text = "The dashboard does not send email when a job finishes."
    trap = Passage(id="S9", collection="issues", source_url="https://issues/1", text=text)
    found = cont.contain(q, "", [], shown, [*shown, *NOISE, trap], answer_counts=False, declined=True)
    assert found.index_holds is False and found.elsewhere_best and found.elsewhere_best.passage is not trap
    assert max(s.coverage for s in found.researched or []) >= cont.INDEX_THRESHOLD  # by the trap
    on_topic = trap.model_copy(update={"text": "A Katib experiment can send an email when it finishes."})
    found = cont.contain(q, "", [], shown, [*shown, *NOISE, on_topic], answer_counts=False, declined=True)
    assert found.index_holds is True


def test_the_users_own_names_and_situation_are_not_what_a_passage_must_hold() -> None:
    q = (
        "Since yesterday the experiment hpo-bert-base in ml-team stays Terminating for an hour; "
        "how do I remove the finalizer of a Katib experiment?"
    )
    page = Passage(
        id="S1",
        collection="issues",
        source_url="https://issues/2519",
        text="A Katib experiment stays Terminating when the controller is down: remove the finalizer by hand.",
    )
    found = cont.contain(q, "", [], [NOISE[0]], [*NOISE, page], answer_counts=False)
    terms = cont.question_terms(q, []) - cont.own_names(q, Pool([cont.passage_text(page)]))
    assert {"hpo-bert-base", "bert", "hpo"}.isdisjoint(terms)  # the user's name for the experiment
    assert {"yesterday", "hour", "sinc"}.isdisjoint(terms)  # the user's situation
    assert {"experiment", "finalizer", "katib"} <= terms
    assert found.index_holds is True
    # a kebab-case name the docs hold is a subject like any other word
    held = Pool(["Restart the katib-db-manager deployment."])
    assert cont.own_names("Why does katib-db-manager crash?", held) == set()


def test_containment_a_decline_is_believed_at_moderate_coverage() -> None:
    q = "How do I set the defaults of min_trials_required for a Katib notebook quota?"
    believed = cont.contain(q, "", [], [PAGE], [PAGE, *NOISE], answer_counts=False, declined=True)
    plain = cont.contain(q, "", [], [PAGE], [PAGE, *NOISE], answer_counts=False, declined=False)
    assert believed.hold_threshold > plain.hold_threshold


def test_containment_a_retrieved_passage_re_found_holds_the_answer_no_better_for_the_index() -> None:
    # an agent that read PAGE and declined: PAGE does not hold the answer for it (a decline is
    # believed up to 0.85), so PAGE found again by the re-search is no evidence the index holds it
    q = "What are the defaults of min_trials_required and start_step in a Katib notebook?"
    found = cont.contain(q, "", [], [PAGE], [PAGE, *NOISE], answer_counts=False, declined=True)
    assert cont.INDEX_THRESHOLD <= found.retrieved[0].coverage < cont.DECLINED_HOLD_THRESHOLD
    assert not found.retrieved_holds and found.index_holds is False
    # the same text on a page the agent was not shown does count
    text = "In Katib, min_trials_required defaults to 3 and start_step to 4."
    other = PAGE.model_copy(update={"id": "S9", "source_url": "https://docs/y", "text": text})
    found = cont.contain(q, "", [], [PAGE], [PAGE, *NOISE, other], answer_counts=False, declined=True)
    assert found.index_holds is True


@pytest.mark.anyio
async def test_the_judge_states_a_confidence_for_every_fact() -> None:
    trace = Trace(
        id="t",
        question="What are the defaults of min_trials_required and start_step in Katib?",
        answer="`min_trials_required` defaults to 3 and `start_step` to 4.",
        tool_calls=[ToolCall(id="c", name="search", args={"query": "median stop"}, collection="docs")],
        passages=[PAGE],
    )
    base = Facts(agent_searched=True, agent_searched_collections=["docs"])
    facts = await HeuristicJudge().judge(JudgeRequest(trace, [PAGE, *NOISE], None, base))
    assert decide(facts).value == "ok"
    for name in ("retrieved_has_answer", "index_has_answer", "answer_grounded", "answer_declined"):
        assert facts.evidence[name].confidence in ("high", "medium", "low")


def _grounding_confidence(grounding: Grounding) -> str | None:
    from triage.judges.heuristic import Signals, _grounding_evidence

    found = cont.contain("q", "", [], [PAGE], [], answer_counts=False)
    return _grounding_evidence(Signals(found, grounding, False, [])).confidence


def test_unseen_specifics_are_a_sure_miss_only_where_another_signal_agrees() -> None:
    """Two harmless unseen tokens (a port, a protocol name) in an answer whose words are the
    passages' are not enough for `high`: the cascade asks the model. Weak prose with most of the
    specifics unseen, many unseen specifics, or an invisible character inside a word are."""
    two = ["9090", "gRPC"]
    assert _grounding_confidence(Grounding(unsupported=two, checked=5, prose_support=0.95)) == "medium"
    assert _grounding_confidence(Grounding(unsupported=two, checked=5, prose_support=None)) == "medium"
    assert _grounding_confidence(Grounding(unsupported=two, checked=4, prose_support=0.4)) == "high"
    # kf-124: an example value and a file named after the question, five of seven specifics seen
    assert _grounding_confidence(Grounding(unsupported=two, checked=7, prose_support=0.59)) == "medium"
    many = ["timeoutSeconds", "maxFailedTrialCount", "primaryContainerName", "dataCache"]
    assert _grounding_confidence(Grounding(unsupported=many, checked=6, prose_support=0.9)) == "high"
    mark = ["kubectl (with an invisible character)"]
    assert _grounding_confidence(Grounding(unsupported=mark, checked=2, prose_support=1.0, invisible=mark)) == "high"


def test_a_seen_kind_in_the_plural_is_seen() -> None:
    seen = ["Custom Resource Definitions (`SparkApplication`) describe the job."]
    assert unsupported_specifics("It submits declarative SparkApplications.", seen)[0] == []
    # only a CamelCase kind: a flag or a key in the plural is another name
    assert unsupported_specifics("Run `--epochs` with `max_trials`.", ["--epoch and max_trial"])[0] == [
        "--epochs",
        "max_trials",
    ]
    assert unsupported_specifics("It submits ScheduledSparkApplications.", seen)[0] == ["ScheduledSparkApplications"]


def test_an_anchor_or_slash_on_a_seen_page_is_no_unsupported_specific() -> None:
    seen = ["Profiles", "https://www.kubeflow.org/docs/components/central-dash/profiles/"]
    page = "https://www.kubeflow.org/docs/components/central-dash/profiles"
    assert unsupported_specifics(f"See {page}/#manage-contributors for details.", seen) == ([], 1)
    assert unsupported_specifics(f"See {page} for details.", seen) == ([], 1)
    # another page under the same path is still a claim of its own, and so is a bare host
    other = "https://www.kubeflow.org/docs/components/central-dash/profiles-admin/#x"
    assert unsupported_specifics(f"See {other}.", seen)[0] == [other]
    assert unsupported_specifics("See https://example.org/#top.", seen)[0] == ["https://example.org/#top"]


def test_names_the_answers_own_code_binds_are_no_claims() -> None:
    answer = (
        "Gather the branches:\n\n```python\nwith dsl.If(flag == 'a'):\n    lgbm_task = train_lgbm()\n"
        "comp = dsl.component(\n    pip_extra_index_url='http://x')\n```\n\n"
        "Then pass `lgbm_task.output` on; `pip_extra_index_url` sets the index."
    )
    assert bound_names(answer) == {"lgbm_task", "comp"}
    # a keyword argument inside a call's brackets binds nothing: it is a claim about the API
    missing, _ = unsupported_specifics(answer, ["train_lgbm dsl.If dsl.component; a task's .output"])
    assert missing == ["http://x", "pip_extra_index_url"]
    # an attribute of the answer's own name is checked as any name is: an invented method is unseen
    invented = "```python\nclient = kfp.Client()\n```\n\nThen `client.resume_all()`."
    assert unsupported_specifics(invented, ["kfp.Client"])[0] == ["client.resume_all()"]


def test_a_fenced_block_ends_at_a_fence_of_its_own_kind() -> None:
    # a `~~~` line inside a ``` block is the block's text (one fence pattern for prose and code alike)
    answer = "Run:\n\n```sh\ncat <<EOF\n~~~\nxs = 1\nEOF\n```\n\nThen ys = 2.\n\n~~~python\nzs = 3"
    assert fenced_code(answer) == ["cat <<EOF\n~~~\nxs = 1\nEOF\n", "zs = 3"]
    assert bound_names(answer) == {"xs", "zs"}  # the prose's `ys = 2` binds nothing
    assert "xs = 1" not in without_code(answer) and "Then ys = 2." in without_code(answer)


def test_a_notebook_named_after_the_question_is_the_questions_own() -> None:
    # the extensions a file name is read with are one list: `.ipynb` as `.yaml`
    q = "Why does my churn-model notebook fail to import kfp?"
    missing, _ = unsupported_specifics("Open `churn-model.ipynb` and run `pip install kfp`.", ["pip install kfp"], q)
    assert missing == []
    # ... and a template that is only a placeholder and an extension fits anything, so it is none
    seen = ["Save it as <NAME>.ipynb."]
    assert unsupported_specifics("Save it as `train-v2.ipynb`.", seen)[0] == ["train-v2.ipynb"]


async def _decline_evidence(answer: str) -> tuple[bool, str]:
    trace = Trace(
        id="t",
        question="How do I set a CSRF cookie policy?",
        answer=answer,
        tool_calls=[ToolCall(id="c", name="search", args={"query": "csrf"}, collection="docs")],
        passages=[PAGE],
    )
    base = Facts(agent_searched=True, agent_searched_collections=["docs"])
    facts = await HeuristicJudge().judge(JudgeRequest(trace, [PAGE, *NOISE], None, base))
    return bool(facts.answer_declined), facts.evidence["answer_declined"].confidence


@pytest.mark.anyio
async def test_a_decline_by_cues_alone_or_an_unnamed_absence_is_never_sure() -> None:
    # the phrase list's decline is clear-cut; the cue check's is not (it may be a claim naming the docs)
    assert await _decline_evidence("I couldn't find a CSRF setting in the docs.") == (True, "high")
    cue_only = "The material in front of me never spells out the CSRF policy."
    assert not listed_phrases(cue_only)
    assert await _decline_evidence(cue_only) == (True, "medium")
    # a substantive answer that says something is not told may be a decline the checks miss
    covers = "Set `APP_PREFIX` and `USERID_HEADER` on the web app's Deployment; nothing about TLS needs to change."
    assert await _decline_evidence(covers) == (False, "medium")
    plain = "Set `APP_SECURE_COOKIES` to `False` on the models web app's Deployment, then restart it."
    assert await _decline_evidence(plain) == (False, "high")
    # other languages' phrase lists are thinner: no phrase found there is never sure
    dutch = "Zet `APP_SECURE_COOKIES` op `False` in de Deployment van de models web app en herstart hem."
    assert await _decline_evidence(dutch) == (False, "medium")


def test_an_absence_cue_needs_no_source_and_the_phrase_list_stands_alone() -> None:
    assert absence_cues("Set the variable; nothing about TLS needs to change.") == ["nothing about"]
    assert absence_cues("Set `APP_PREFIX` to `/models`.") == []
    assert listed_phrases("I couldn't find it.") == ["I couldn't find"]
    assert listed_phrases("The material in front of me never spells out the policy.") == []


@pytest.mark.parametrize(
    ("answer", "declined"),
    [
        ("The docs say that if the ConfigMap is not provided, you deploy it in the namespace.", False),
        ("The docs say that if the ConfigMap has not been provided, you deploy it.", False),
        ("The ConfigMap is still not provided by the chart, so create it.", False),
        ("Per the docs, no data is lost when the pod restarts.", False),
        ("The trial results don't include the metric unless the collector parses it.", False),
        ("If none of the containers become ready, the trial stays Pending.", False),
        ("The condition reports status: Unknown until the controller reconciles.", False),
        ("Short answer: none. Katib needs no extra config.", False),
        ("None of them mention the retry budget.", True),
        ("The documentation never mentions a quota.", True),
        ("I cant find anything about this in the docs.", True),
        ("I'm not sure whether Katib supports this at all; you could ask on Slack.", True),
        ("Si no se especifica el namespace, se usa el del perfil.", False),
        ("Dem Upgrade steht nichts im Weg.", False),
        ("В пайплайне описан шаг обучения.", False),
        ("如果不知道 Profile 的名字，运行 kubectl get profiles。", False),
        ("The control plane has four parts, and nothing I found describes trials in another cluster.", True),
        ("Short answer: not as far as the docs go.", True),
        ("Dat kan ik uit de documentatie niet opmaken; het staat er niet.", True),
        ("From the page I found: it covers the variables, but nothing about TLS.", True),
        ("I can't pin this down from the documentation.", True),
    ],
)
def test_a_passive_is_no_telling_and_the_texts_may_be_it(answer: str, declined: bool) -> None:
    assert declines(answer) is declined


def test_a_yes_or_no_word_in_the_question_is_no_value_of_the_users() -> None:
    passages = ["enable_caching: false keeps every run fresh"]
    question = "Is it true that caching is on?"
    found = value_contradictions("Set enable_caching: true.", passages, [question, *passages, "true"], question)
    assert found  # "true" in the question is a word, not the user's value: still a swap


def test_a_template_ends_before_punctuation_and_many_slots_stay_linear() -> None:
    seen = ["The role is kubeflow-<USER_ROLE>. Files: <NAME>.yaml"]
    missing, _ = unsupported_specifics("Bind `kubeflow-view`, apply `team.yaml`.", seen)
    assert missing == ["team.yaml"]  # `<NAME>.yaml` is no template: its only literal is an extension
    slots = ["x-<A>-<B>-<C>-y"]
    needle = "`x-" + "a-" * 3000 + "y`"
    done = threading.Event()
    worker = threading.Thread(target=lambda: (unsupported_specifics(needle, slots), done.set()), daemon=True)
    worker.start()
    assert done.wait(10), "template matching backtracks: a guard against a catastrophic match, not a speed target"


def test_one_common_specific_is_no_support() -> None:
    q = "How long does the tuner wait before it gives up on a hopeless try?"
    found = cont.contain(q, "Run `min_trials_required`.", [], [PAGE], [PAGE, *NOISE], answer_counts=True)
    assert found.answer_support == 1.0 and found.answer_specifics == 1
    assert not found.supported


@pytest.mark.anyio
async def test_not_in_the_index_is_never_sure_where_the_retrieved_page_has_more_sections() -> None:
    # right page, wrong chunks: another section of the page the agent retrieved may answer in words
    # the question does not use, so the cascade asks the model
    shown = Passage(id="R1", collection="docs", source_url="https://docs/x", text="Katib runs experiments.")
    other = Passage(id="S9", collection="docs", source_url="https://docs/x", text="Trials report metrics.")
    trace = Trace(
        id="t",
        question="Can the tuner email me when a hopeless try is stopped?",
        answer="I couldn't find that in the docs.",
        tool_calls=[ToolCall(id="c", name="search", args={"query": "email"}, collection="docs")],
        passages=[shown],
    )
    base = Facts(agent_searched=True, agent_searched_collections=["docs"])
    alone = await HeuristicJudge().judge(JudgeRequest(trace, [shown, *NOISE], None, base))
    more = await HeuristicJudge().judge(JudgeRequest(trace, [shown, *NOISE, other], None, base))
    assert alone.index_has_answer is False and more.index_has_answer is False
    assert alone.evidence["index_has_answer"].confidence == "high"
    assert more.evidence["index_has_answer"].confidence == "medium"
    # the retrieved passage re-found with other whitespace, or cut longer, is no other section: a
    # passage is "shown" by the same test containment uses for "elsewhere"
    again = shown.model_copy(update={"id": "S8", "text": "Katib  runs\nexperiments. And more of it."})
    same = await HeuristicJudge().judge(JudgeRequest(trace, [shown, *NOISE, again], None, base))
    assert same.evidence["index_has_answer"].confidence == "high"


async def _retrieved_miss(question: str, answer: str, passage: Passage) -> tuple[bool | None, str, str]:
    trace = Trace(
        id="t",
        question=question,
        answer=answer,
        tool_calls=[ToolCall(id="c", name="search", args={"query": "q"}, collection="docs")],
        passages=[passage],
    )
    base = Facts(agent_searched=True, agent_searched_collections=["docs"])
    facts = await HeuristicJudge().judge(JudgeRequest(trace, [passage, *NOISE], None, base))
    ev = facts.evidence
    return facts.retrieved_has_answer, ev["retrieved_has_answer"].confidence, ev["index_has_answer"].confidence


@pytest.mark.anyio
async def test_a_miss_is_never_sure_where_the_answer_is_the_passages_own_words() -> None:
    # the user's words (a security review, 400 GB, storage) are not the page's; the answer, in the
    # page's own words, shows the page answers
    page = Passage(
        id="R1",
        collection="docs",
        source_url="https://docs/catalog",
        text="The catalog is a read-only discovery service. It does not store model weights or artifacts, "
        "only metadata and references to the source repositories.",
    )
    question = "Security review: will turning it on pull 400 GB blobs onto our cluster's storage?"
    faithful = (
        "No. The catalog is a read-only discovery service: it does not store model weights or artifacts, "
        "only metadata and references to the source repositories."
    )
    invented = (
        "Yes. Once enabled, it mirrors every blob nightly onto a persistent volume you size yourself, "
        "then garbage-collects stale copies weekly."
    )
    assert await _retrieved_miss(question, faithful, page) == (False, "medium", "medium")
    assert await _retrieved_miss(question, invented, page) == (False, "high", "high")


@pytest.mark.anyio
async def test_a_miss_is_never_sure_where_the_question_quotes_its_own_code() -> None:
    # `t1`, `preprocess`, `shard`, `merge`: the user's names weigh as the rarest words, so a low
    # coverage says little
    question = (
        "Inside `with dsl.ParallelFor(shards) as shard:` I call `t1 = preprocess(shard=shard)` and "
        "`merge().after(t1)`. Why?"
    )
    plain = "Inside a loop I call a preprocess step per shard and a merge step after it. Why?"
    made_up = "Set the loop's parallelism to 1 and the merge step starts after the last shard has finished."
    assert await _retrieved_miss(question, made_up, PAGE) == (False, "medium", "medium")
    assert await _retrieved_miss(plain, made_up, PAGE) == (False, "high", "high")


# -- support where the answer is, and contradictions (issue #30, item 4) ------------------------------
#
# Invented pages, not the evaluation set's: a culling page that restricts a statement to two image
# kinds, and an images page that names a third. The question is the culling page's.

CULLING = Passage(
    id="R1",
    collection="docs",
    source_url="https://docs.example/notebooks/culling/",
    title="Notebook culling",
    text="The idle culler stops notebook servers whose kernels had no activity for `CULL_IDLE_TIME` minutes, "
    "checked every `IDLENESS_CHECK_PERIOD` minutes. Currently, culling works only with `JupyterLab` and "
    "`VSCode` images; servers of other images keep running.",
)
IMAGES = Passage(
    id="R2",
    collection="docs",
    source_url="https://docs.example/notebooks/images/",
    title="Notebook images",
    text="Kubeflow ships three image families, `JupyterLab`, `VSCode` and `RStudio`, each in a CPU and a CUDA "
    "variant. Build your own from `kubeflownotebookswg/base` with `docker build -t my-registry/nb:1 .`.",
)
CULL_QUESTION = "Which notebook servers does the idle culler stop, and after how long?"
CULL_NOISE = [
    Passage(id=f"S{i}", collection="docs", source_url=f"https://docs.example/n{i}", text=text)
    for i, text in enumerate(
        ["Pipelines run on Argo Workflows.", "Katib tunes hyperparameters with trials.", "Profiles own namespaces."], 3
    )
]
#: the culling page's own words and values: grounded where the answer is
CULL_FAITHFUL = (
    "The idle culler stops `JupyterLab` and `VSCode` notebook servers whose kernels had no activity for "
    "`CULL_IDLE_TIME` minutes, checked every `IDLENESS_CHECK_PERIOD` minutes."
)


def cull_trace(answer: str) -> Trace:
    call = ToolCall(id="c", name="search_kubeflow_docs", args={"query": "notebook idle culler"}, collection="docs")
    return Trace(id="t", question=CULL_QUESTION, answer=answer, tool_calls=[call], passages=[CULLING, IMAGES])


async def cull_facts(answer: str) -> Facts:
    trace = cull_trace(answer)
    base = Facts(agent_searched=True, agent_searched_collections=["docs"])
    return await HeuristicJudge().judge(JudgeRequest(trace, [CULLING, IMAGES, *CULL_NOISE], None, base))


def grounding_of(facts: Facts) -> tuple[bool | None, str | None]:
    return facts.answer_grounded, facts.evidence["answer_grounded"].confidence


@pytest.mark.anyio
async def test_the_answering_passage_is_the_one_that_covers_the_question() -> None:
    found = cont.contain(CULL_QUESTION, CULL_FAITHFUL, [], [CULLING, IMAGES], CULL_NOISE, answer_counts=True)
    assert [p.id for p in found.answering] == ["R1"]
    facts = await cull_facts(CULL_FAITHFUL)
    assert facts.retrieved_has_answer is True and facts.evidence["retrieved_has_answer"].confidence == "high"
    assert grounding_of(facts) == (True, "high")


@pytest.mark.anyio
async def test_a_value_seen_only_in_another_passage_is_never_sure_support() -> None:
    """The answer adds `kubeflownotebookswg/base`, which the images page holds and the culling page,
    the one that answers, does not: seen by the agent, so not unsupported, but not surely grounded."""
    answer = (
        "The idle culler stops notebook servers whose kernels had no activity for `CULL_IDLE_TIME` minutes, "
        "checked every `IDLENESS_CHECK_PERIOD` minutes. Build your own image from `kubeflownotebookswg/base`."
    )
    facts = await cull_facts(answer)
    assert grounding_of(facts) == (True, "medium")
    assert "only outside the passages that answer (kubeflownotebookswg/base)" in (
        facts.evidence["answer_grounded"].note or ""
    )
    # ... the same answer quoting a whole command line of that page shows its source itself
    quoting = answer.replace("from `kubeflownotebookswg/base`", "with `docker build -t my-registry/nb:1 .`")
    assert grounding_of(await cull_facts(quoting)) == (True, "high")


@pytest.mark.anyio
async def test_a_value_the_answering_passage_restricts_away_is_a_contradiction() -> None:
    """The culling page says culling works *only* with JupyterLab and VSCode images; an answer that
    lists RStudio beside them is contradicted there, though the images page holds `RStudio`."""
    added = CULL_FAITHFUL.replace("`JupyterLab` and `VSCode`", "`JupyterLab`, `VSCode` and `RStudio`")
    facts = await cull_facts(added)
    assert grounding_of(facts) == (False, "high")
    assert any("rstudio" in c for c in facts.unsupported_claims)
    assert decide(facts).value == "generation"
    # leaving it out, or naming it as left out, is no contradiction
    assert grounding_of(await cull_facts(CULL_FAITHFUL)) == (True, "high")
    but_not = CULL_FAITHFUL.replace("`VSCode` notebook", "`VSCode` notebook servers, but not `RStudio` ones, or")
    assert grounding_of(await cull_facts(but_not))[0] is True


def test_a_restriction_is_read_from_the_sentence_that_says_only() -> None:
    passage = "For a Trial, early stopping works only with the `Pull` or `Push` collectors. Other kinds exist."
    extended = "Early stopping works with the `Pull`, `Push` and `Sidecar` collectors."
    assert restriction_contradictions(extended, [passage]) == ["sidecar (a passage restricts it to pull, push)"]
    assert restriction_contradictions("Early stopping works with the `Pull` collector.", [passage]) == []
    # another subject, or a name written otherwise (a key, not a kind), is no extension of the list
    assert restriction_contradictions("Metrics work with `Pull`, `Push` and `Sidecar`.", [passage]) == []
    keyed = "Early stopping works with the `Pull` collector, set `max_wait`."
    assert restriction_contradictions(keyed, [passage]) == []
    # the passage naming the value itself elsewhere: not a value the restriction leaves out
    assert restriction_contradictions(extended, [passage + " The `Sidecar` collector is legacy."]) == []
    # ... and whichever passage says it, the grounding check reads it from the passages that answer
    both = [passage, "Collectors: `Sidecar`."]
    grounding = check(extended, both, both, answering=[passage])
    assert grounding.contradictions and grounding.against_answering
    elsewhere = check(extended, both, both, answering=both[1:])
    assert not elsewhere.against_answering


def test_a_quoted_span_is_a_run_of_words_a_passage_holds() -> None:
    page = "Build it with `docker build -t my-registry/nb:1 .` from `kubeflownotebookswg/base`."
    command = "docker build -t my-registry/nb:1 ."
    assert quoted_spans(f"Run `{command}` first.", [page]) == [command]
    # one long token is a token, not a quote
    assert quoted_spans("Start from `kubeflownotebookswg/base`.", [page]) == []
    assert quoted_spans('It says "build it with docker from the base image" somewhere.', [page]) == []
    base = "kubeflownotebookswg/base"
    assert outside_support(f"Start from `{base}`.", ["The culler."], [page]) == [base]


def test_a_clean_decline_is_surely_grounded_and_one_that_guesses_on_is_not() -> None:
    """A decline in a listed phrase, in English, with no unseen specific and most of its other words
    the passages', claims nothing they do not say: `high`. One that goes on guessing ("probably",
    "typically": the "the docs don't say, but ..." answer), or whose other words are not the
    passages', or found by cues alone, is not sure."""
    from triage.judges.heuristic import Signals, _grounding_evidence

    found = cont.contain("q", "", [], [PAGE], [], answer_counts=False)
    phrase = ["I couldn't find"]

    def level(answer: str, prose: float | None = 0.8, listed: bool = True) -> str | None:
        grounding = Grounding(checked=0, prose_support=prose)
        return _grounding_evidence(Signals(found, grounding, True, phrase, listed), answer).confidence

    clean = "I couldn't find a retention setting in the docs. The page lists a run's artifacts and logs."
    assert level(clean) == "high"
    assert level(clean, prose=None) == "high"  # nothing but the decline
    assert level(clean.replace("and logs.", "and logs; runs are probably kept for 30 days.")) != "high"
    assert level("I couldn't find it in the docs. Such limits are typically set per namespace.") != "high"
    assert level(clean, prose=0.3) != "high"
    assert level(clean, listed=False) != "high"
