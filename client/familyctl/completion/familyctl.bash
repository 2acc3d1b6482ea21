# bash completion for familyctl: verbs, each verb's flags (from `familyctl VERB --help`),
# and from a daemon that answers within half a second, family names, build ids and mesh ids.
# Installed as familyctl in bash-completion's completions directory; or `source` this file.

_familyctl_socket() {
        # The --socket/-s given on the line so far, for the daemon queries.
        local i
        for ((i = 1; i < ${#COMP_WORDS[@]} - 1; i++)); do
                case ${COMP_WORDS[i]} in
                -s|--socket) printf -- '--socket\n%s\n' "${COMP_WORDS[i + 1]}"; return ;;
                --socket=*) printf -- '%s\n' "${COMP_WORDS[i]}"; return ;;
                esac
        done
}

_familyctl_query() {
        # One column of a table verb, from the daemon, or nothing when it does not answer.
        local -a sock
        mapfile -t sock < <(_familyctl_socket)
        "${COMP_WORDS[0]}" "${sock[@]}" --timeout 500 "$1" -o "$2" --noheadings --raw 2>/dev/null
}

_familyctl() {
        local cur=${COMP_WORDS[COMP_CWORD]} prev=${COMP_WORDS[COMP_CWORD - 1]}
        local verbs="families family resolve mesh meshes topology forget status version reload build
                     builds build-info release pin unpin publish shard validate keygen checkpoint"
        local globals="--socket --json --timeout --help --version"
        local verb="" i

        for ((i = 1; i < COMP_CWORD; i++)); do
                case ${COMP_WORDS[i]} in
                -s|--socket|-t|--timeout|-o|--output) ((i++)) ;;
                -*) ;;
                *) verb=${COMP_WORDS[i]}; break ;;
                esac
        done

        case $prev in
        -s|--socket|--config|--module|--checkpoint|--shard-socket)
                mapfile -t COMPREPLY < <(compgen -f -- "$cur"); return ;;
        -t|--timeout|-o|--output|--seed|--ranks|--dtype-of|--arg|--prefix) COMPREPLY=(); return ;;
        --dtype) mapfile -t COMPREPLY < <(compgen -W "float32 bfloat16 float16" -- "$cur"); return ;;
        --mode) mapfile -t COMPREPLY < <(compgen -W "read-only private shared" -- "$cur"); return ;;
        --checkpoint-names)
                mapfile -t COMPREPLY < <(compgen -W "registry parameters" -- "$cur"); return ;;
        esac

        if [[ -z $verb ]]; then
                if [[ $cur == -* ]]; then
                        mapfile -t COMPREPLY < <(compgen -W "$globals" -- "$cur")
                else
                        mapfile -t COMPREPLY < <(compgen -W "$verbs" -- "$cur")
                fi
                return
        fi

        if [[ $cur == -* ]]; then
                local flags
                flags=$("${COMP_WORDS[0]}" "$verb" --help 2>/dev/null |
                        grep -o -- '--[a-z][a-z-]*' | sort -u)
                mapfile -t COMPREPLY < <(compgen -W "$flags $globals" -- "$cur")
                return
        fi

        local words=""
        case $verb in
        family|resolve|build) [[ $prev == "$verb" ]] && words=$(_familyctl_query families name) ;;
        build-info|release|pin|unpin|publish|shard)
                [[ $prev == "$verb" ]] && words=$(_familyctl_query builds build_id) ;;
        mesh)
                if [[ $prev == mesh ]]; then
                        words="create get delete"
                elif [[ $prev == get || $prev == delete ]]; then
                        words=$(_familyctl_query meshes mesh_id)
                fi ;;
        checkpoint)
                if [[ $prev == checkpoint ]]; then
                        words="inspect"
                else
                        mapfile -t COMPREPLY < <(compgen -f -- "$cur"); return
                fi ;;
        validate|keygen) mapfile -t COMPREPLY < <(compgen -f -- "$cur"); return ;;
        esac
        mapfile -t COMPREPLY < <(compgen -W "$words" -- "$cur")
}

complete -F _familyctl familyctl
